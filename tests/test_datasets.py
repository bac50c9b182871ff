from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import packer
from packer.demo.image import DemoTree
from packer.errors import FormatError, PackerError


def test_outputs(packed: dict[str, Path], suffix: str) -> None:
    pil, label = packer.open_dataset(packed[suffix])[0]
    assert isinstance(pil, Image.Image) and pil.mode == "RGB" and pil.size == (64, 48)
    array, _ = packer.open_dataset(packed[suffix], output="numpy")[0]
    assert array.shape == (48, 64, 3) and array.dtype == np.uint8
    assert np.array_equal(array, np.asarray(pil))
    tensor, _ = packer.open_dataset(packed[suffix], output="tensor")[0]
    assert tensor.shape == (3, 48, 64) and tensor.dtype == torch.uint8
    assert np.array_equal(tensor.permute(1, 2, 0).numpy(), array)
    assert label == 0


def test_imagefolder_api(packed: dict[str, Path], tree: DemoTree, suffix: str) -> None:
    dataset = packer.open_dataset(packed[suffix])
    folder = packer.FolderDataset(tree.root, is_valid_file=lambda p: "broken" not in p)
    assert dataset.classes == folder.classes == tree.classes
    assert dataset.class_to_idx == {c: i for i, c in enumerate(tree.classes)}
    assert list(dataset.targets) == list(folder.targets)
    assert len(dataset) == len(folder) == len(tree.good)
    with pytest.raises(IndexError):
        dataset[len(dataset)]
    assert dataset[-1][1] == dataset.targets[-1]


def test_transforms_applied(packed: dict[str, Path]) -> None:
    dataset = packer.open_dataset(
        packed[".lmdb"], transform=lambda im: im.size, target_transform=lambda y: y + 100
    )
    assert dataset[5] == ((64, 48), 101)


def test_getitems_matches_getitem(packed: dict[str, Path], suffix: str) -> None:
    dataset = packer.open_dataset(packed[suffix], output="bytes")
    indices = [7, 0, 11, 3, 3, -1]
    assert dataset.__getitems__(indices) == [dataset[i] for i in indices]


def test_pickle_after_read(packed: dict[str, Path], suffix: str) -> None:
    dataset = packer.open_dataset(packed[suffix], output="bytes")
    before = [dataset[i] for i in range(len(dataset))]
    clone = pickle.loads(pickle.dumps(dataset))
    assert [clone[i] for i in range(len(clone))] == before


def test_folder_dataset_reads_source(tree: DemoTree) -> None:
    folder = packer.open_dataset(tree.root, output="bytes")
    assert isinstance(folder, packer.FolderDataset)
    assert len(folder) == len(tree.good) + len(tree.bad)
    broken = next(i for i in range(len(folder)) if "broken" in folder.paths[i])
    with pytest.raises(PackerError, match="broken_000.JPEG.*cannot be decoded"):
        packer.FolderDataset(tree.root)[broken]


def test_wrong_class_for_format(packed: dict[str, Path]) -> None:
    with pytest.raises(FormatError, match="holds format 'npy', not 'lmdb'"):
        packer.LMDBDataset(packed[".npy"])


def test_incomplete_output_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    partial = tmp_path / "x.lmdb"
    partial.mkdir()
    with pytest.raises(FormatError, match="no packer.json"):
        packer.open_dataset(partial)
    with pytest.raises(FormatError, match="not a complete packer dataset"):
        packer.LMDBDataset(partial)


def test_unknown_output_refused(packed: dict[str, Path]) -> None:
    with pytest.raises(PackerError, match="unknown output 'jpeg'"):
        packer.open_dataset(packed[".npy"], output="jpeg")


def test_no_handle_opened_in_init(packed: dict[str, Path], suffix: str) -> None:
    dataset = packer.open_dataset(packed[suffix], output="bytes")
    assert len(dataset.reader.handles) == 0
    dataset[0]
    assert len(dataset.reader.handles) == (0 if suffix == ".bmp" else 1)


def test_keys_slice_and_repr_and_contiguous_tensors(packed: dict[str, Path]) -> None:
    dataset = packer.open_dataset(packed[".npy"], output="tensor")
    keys = dataset.keys
    assert keys[:2] == [keys[0], keys[1]] and keys[-1:] == [keys[len(keys) - 1]]
    assert f"{len(keys)} strings" in repr(keys) and repr(keys[0]) in repr(keys)
    image, _ = dataset[0]
    assert image.is_contiguous() and image.shape[0] == 3
