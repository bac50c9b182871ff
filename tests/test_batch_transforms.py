"""Batch-level Normalize and RandomHorizontalFlip on uint8 tensors (issue 31, item 2)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import packer
from packer.errors import PackerError
from packer.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Normalize,
    RandomHorizontalFlip,
    RandomResizedCrop,
)


def _batch(count: int = 6, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, 3, 20, 24), dtype=torch.uint8, generator=generator)


def _reference(batch: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """torchvision's ToTensor + Normalize, written out in float64."""
    m = torch.tensor(mean, dtype=torch.float64).reshape(-1, 1, 1)
    s = torch.tensor(std, dtype=torch.float64).reshape(-1, 1, 1)
    return (batch.to(torch.float64) / 255 - m) / s


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [
        (torch.float32, 1e-5),
        (torch.float16, 1.2e-2),
        (torch.bfloat16, 6e-2),
        (torch.float64, 1e-12),
    ],
)
def test_normalize_equals_to_tensor_then_normalize(dtype: torch.dtype, tolerance: float) -> None:
    batch = _batch()
    out = Normalize(dtype=dtype)(batch)
    assert out.dtype == dtype and out.shape == batch.shape and out.device == batch.device
    assert (out.to(torch.float64) - _reference(batch)).abs().max().item() <= tolerance
    single = Normalize(dtype=dtype)(batch[2])  # one C×H×W image
    assert torch.equal(single, out[2])
    assert batch.dtype == torch.uint8 and int(batch.max()) > 1  # the input is left alone


def test_normalize_custom_channels_and_layouts() -> None:
    gray = _batch(4)[:, :1]
    norm = Normalize(mean=(0.5,), std=(0.25,))
    assert torch.allclose(norm(gray).double(), _reference(gray, (0.5,), (0.25,)), atol=1e-5)
    last = _batch(4).contiguous(memory_format=torch.channels_last)
    assert torch.equal(Normalize()(last), Normalize()(last.contiguous()))


def test_normalize_survives_pickling_after_use() -> None:
    norm = Normalize(dtype=torch.float16)
    first = norm(_batch())
    again = pickle.loads(pickle.dumps(norm))
    assert again._constants == {} and torch.equal(again(_batch()), first)
    assert "float16" in repr(again)


def test_flip_flips_whole_images_with_probability_p() -> None:
    batch = _batch(2000, seed=1)
    out = RandomHorizontalFlip(seed=7)(batch)
    flipped = torch.tensor([torch.equal(out[i], batch[i].flip(-1)) for i in range(len(batch))])
    kept = torch.tensor([torch.equal(out[i], batch[i]) for i in range(len(batch))])
    assert bool((flipped | kept).all())  # each image is itself or its mirror, nothing else
    assert 900 <= int(flipped.sum()) <= 1100  # p = 0.5: 1000 ± 4.5 sigma
    assert torch.equal(RandomHorizontalFlip(seed=7)(batch), out)  # a seed reproduces it
    assert not torch.equal(RandomHorizontalFlip(seed=8)(batch), out)
    assert torch.equal(RandomHorizontalFlip(p=1.0)(batch), batch.flip(-1))
    assert torch.equal(RandomHorizontalFlip(p=0.0)(batch), batch)


def test_flip_draws_from_torch_and_copies_unless_inplace() -> None:
    batch = _batch(64)
    torch.manual_seed(3)
    first = RandomHorizontalFlip()(batch)
    torch.manual_seed(3)
    assert torch.equal(RandomHorizontalFlip()(batch), first)
    original = batch.clone()
    RandomHorizontalFlip(p=1.0)(batch)
    assert torch.equal(batch, original)
    returned = RandomHorizontalFlip(p=1.0, inplace=True)(batch)
    assert torch.equal(batch, original.flip(-1)) and returned.data_ptr() == batch.data_ptr()
    assert torch.equal(RandomHorizontalFlip(p=1.0)(original[0]), original[0].flip(-1))


@pytest.mark.parametrize(
    ("call", "bad", "words"),
    [
        (Normalize(), _batch().float(), "uint8"),
        (Normalize(), _batch()[:, :2], "3 channel"),
        (Normalize(), torch.zeros(5, 5, dtype=torch.uint8), "C×H×W"),
        (RandomHorizontalFlip(), [1, 2, 3], "tensor"),
        (RandomHorizontalFlip(), _batch().half(), "uint8"),
    ],
)
def test_bad_batches_are_named(call, bad, words: str) -> None:
    with pytest.raises(PackerError, match=words):
        call(bad)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(PackerError, match="one value per channel"):
        Normalize(mean=(0.5, 0.5), std=(0.2,))
    with pytest.raises(PackerError, match="positive"):
        Normalize(std=(0.2, 0.0, 0.2))
    with pytest.raises(PackerError, match="float type"):
        Normalize(dtype=torch.int32)
    with pytest.raises(PackerError, match="probability"):
        RandomHorizontalFlip(p=1.5)


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_uint8_batches_from_workers_finish_in_the_training_process(
    packed: dict[str, Path], context: str
) -> None:
    """The documented path: workers ship uint8 crops; flip + normalize run where the model is."""
    dataset = packer.open_dataset(
        packed[".lmdb"], output="bytes", transform=RandomResizedCrop(32, seed=0)
    )
    loader = DataLoader(
        dataset, batch_size=5, num_workers=2, multiprocessing_context=context, pin_memory=False
    )
    flip, normalize = RandomHorizontalFlip(seed=0), Normalize(dtype=torch.float16)
    seen = 0
    for images, labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 32, 32)
        out = normalize(flip(images))
        assert out.dtype == torch.float16 and out.shape == images.shape
        assert float(out.min()) >= -2.2 and float(out.max()) <= 2.7  # ImageNet's range
        seen += len(labels)
    assert seen == len(dataset)
