"""Decode fused with the crop: output shape, determinism, the crop distribution against a
reference of torchvision's algorithm (two-sample Kolmogorov–Smirnov), the DCT scale choice, the
pixel error against decode-then-crop-then-resize, and DataLoader workers.

Pixel error (0–255 scale, mean absolute difference per image, packer's grainy photo-like JPEGs):
about 0.04 when the crop is decoded at full scale (every pixel within 1), about 2–3 when libjpeg decodes at 1/2 or 1/4
(its scaled IDCT low-passes the grain differently from bilinear antialiasing). Bound checked:
the mean over the draws < 3, every image < 6. The centre crop at full scale equals torchvision's
Resize + CenterCrop up to Pillow's fixed-point rounding (no pixel off by more than 1)."""

from __future__ import annotations

import io
import math
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from packer.decode import fast as fast_decoders
from packer.decode.transforms import (
    RandomResizedCrop,
    ResizedCenterCrop,
    crop_params,
    decode_scaled,
    pick_denom,
)
from packer.demo.image import photo_like
from packer.errors import PackerError
from packer.read.open import open_dataset

DECODERS = ["auto", "pillow", "simplejpeg", "opencv"] + (
    ["turbojpeg"] if "turbojpeg" in fast_decoders.available() else []
)


def encode(image: Image.Image, fmt: str = "JPEG", **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


PHOTO = photo_like(np.random.default_rng(3), 1200, 900)
JPEG = encode(PHOTO, quality=90)


def reference_params(
    rng: np.random.Generator, width: int, height: int, scale: tuple, ratio: tuple
) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params, written again with numpy's generator."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov–Smirnov D: the largest gap between the empirical CDFs."""
    points = np.concatenate([a, b])
    cdf_a = np.searchsorted(np.sort(a), points, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), points, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


def features(params: list[tuple[int, int, int, int]], width: int, height: int) -> np.ndarray:
    p = np.array(params, dtype=np.float64)
    return np.stack([p[:, 2] * p[:, 3] / (width * height), np.log(p[:, 3] / p[:, 2])])


@pytest.mark.parametrize("width, height", [(500, 375), (1000, 120), (64, 48)])
def test_crop_distribution_matches_torchvision_algorithm(width: int, height: int) -> None:
    draws, scale, ratio = 4000, (0.08, 1.0), (3 / 4, 4 / 3)
    generator = torch.Generator().manual_seed(0)
    ours = [crop_params(width, height, scale, ratio, generator) for _ in range(draws)]
    rng = np.random.default_rng(0)
    theirs = [reference_params(rng, width, height, scale, ratio) for _ in range(draws)]
    wrong = [reference_params(rng, width, height, (0.2, 1.0), ratio) for _ in range(draws)]
    for top, left, h, w in ours:
        assert 0 <= top <= height - h and 0 <= left <= width - w and h > 0 and w > 0
    critical = 1.95 * math.sqrt(2 / draws)  # alpha = 0.001
    mine, ref = features(ours, width, height), features(theirs, width, height)
    for k in range(2):  # area fraction, log aspect ratio
        assert ks_statistic(mine[k], ref[k]) < critical
    bad = features(wrong, width, height)
    assert ks_statistic(bad[0], ref[0]) > critical  # the test can tell a wrong scale range


def test_fallback_is_a_centre_crop_clamped_to_the_ratio() -> None:
    generator = torch.Generator().manual_seed(0)
    # a 1000×10 strip: no random crop of area >= 8% fits with a ratio <= 4/3
    assert crop_params(1000, 10, (0.5, 1.0), (3 / 4, 4 / 3), generator) == (0, 493, 10, 13)
    assert crop_params(10, 1000, (0.5, 1.0), (3 / 4, 4 / 3), generator) == (493, 0, 13, 10)


def test_pick_denom_is_the_smallest_scale_that_covers() -> None:
    assert pick_denom(1792, 1792, 224, 224) == 8
    assert pick_denom(1791, 1792, 224, 224) == 4
    assert pick_denom(896, 2000, 224, 224) == 4
    assert pick_denom(895, 2000, 224, 224) == 2
    assert pick_denom(448, 448, 224, 224) == 2
    assert pick_denom(447.5, 448, 224, 224) == 1
    assert pick_denom(100, 100, 224, 224) == 1  # upsampling: decode in full
    assert pick_denom(1792, 900, 224, 112) == 8  # each side against its own output side


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("denom", fast_decoders.DENOMS)
def test_scaled_decode_sizes(decoder: str, denom: int) -> None:
    image, got = decode_scaled(JPEG, denom, decoder)
    assert got == denom and image.mode == "RGB"
    assert image.size == (-(-1200 // denom), -(-900 // denom))


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("output", ["tensor", "numpy", "pil"])
def test_output_size_dtype_channels(decoder: str, output: str) -> None:
    inputs = [
        JPEG,
        encode(PHOTO.convert("L"), quality=80),
        encode(PHOTO.convert("CMYK")),
        encode(PHOTO.resize((300, 200)), "PNG"),
        encode(PHOTO, progressive=True),
    ]
    for transform in (
        RandomResizedCrop((112, 96), decoder=decoder, output=output),
        ResizedCenterCrop((112, 96), resize=128, decoder=decoder, output=output),
    ):
        for data in inputs:
            out = transform(data)
            if output == "tensor":
                assert out.dtype == torch.uint8 and tuple(out.shape) == (3, 112, 96)
            elif output == "numpy":
                assert out.dtype == np.uint8 and out.shape == (112, 96, 3) and out.flags.writeable
            else:
                assert out.mode == "RGB" and out.size == (96, 112)


def test_determinism_under_seeds() -> None:
    def draws(transform: RandomResizedCrop) -> list[np.ndarray]:
        return [transform(JPEG) for _ in range(4)]

    torch.manual_seed(5)
    a = draws(RandomResizedCrop(64, output="numpy"))
    torch.manual_seed(5)
    b = draws(RandomResizedCrop(64, output="numpy"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = draws(RandomResizedCrop(64, output="numpy", seed=1))
    d = draws(RandomResizedCrop(64, output="numpy", seed=1))
    e = draws(RandomResizedCrop(64, output="numpy", seed=2))
    assert all(np.array_equal(x, y) for x, y in zip(c, d))
    assert not all(np.array_equal(x, y) for x, y in zip(c, e))
    copy = pickle.loads(pickle.dumps(RandomResizedCrop(64, output="numpy", seed=1)))
    assert all(np.array_equal(x, y) for x, y in zip(c, draws(copy)))


@pytest.mark.parametrize("decoder", ["pillow", "simplejpeg", "opencv"])
def test_fused_matches_decode_crop_resize(decoder: str) -> None:
    rng = np.random.default_rng(11)
    errors, denoms = [], set()
    for k in range(6):
        data = encode(photo_like(rng, 1200, 900), quality=90)
        full = Image.open(io.BytesIO(data)).convert("RGB")
        transform = RandomResizedCrop(224, decoder=decoder, output="numpy", seed=k)
        for _ in range(4):
            state = transform.generator().get_state()  # type: ignore[union-attr]
            box = transform.box(1200, 900)
            transform.generator().set_state(state)  # type: ignore[union-attr]
            fused = transform(data).astype(np.int16)
            crop = full.crop(tuple(int(v) for v in box))
            reference = np.asarray(crop.resize((224, 224), Image.Resampling.BILINEAR))
            errors.append(np.abs(fused - reference.astype(np.int16)).mean())
            denoms.add(pick_denom(box[2] - box[0], box[3] - box[1], 224, 224))
    assert denoms > {1}  # scaled decodes were exercised
    assert np.mean(errors) < 3 and max(errors) < 6


@pytest.mark.parametrize("decoder", ["pillow", "simplejpeg", "opencv"])
def test_a_full_scale_crop_is_crop_then_resize_within_one(decoder: str) -> None:
    """Issue 31: at full scale the box is resampled by torch's uint8 antialiased kernel, crop
    first as torchvision (Pillow's box resize read pixels outside the box at its edges: up to
    30 off there). Every pixel within 1 of Pillow's crop + resize."""
    rng = np.random.default_rng(3)
    for k in range(4):
        data = encode(photo_like(rng, 400, 350), quality=90)
        full = Image.open(io.BytesIO(data)).convert("RGB")
        transform = RandomResizedCrop(224, decoder=decoder, output="numpy", seed=k)
        tensors = RandomResizedCrop(224, decoder=decoder, output="tensor", seed=k)
        for _ in range(4):
            state = transform.generator().get_state()  # type: ignore[union-attr]
            box = transform.box(400, 350)
            transform.generator().set_state(state)  # type: ignore[union-attr]
            fused = transform(data)
            assert (
                fused.flags.writeable and fused.flags.c_contiguous and fused.shape == (224, 224, 3)
            )
            assert torch.equal(tensors(data), torch.from_numpy(fused).permute(2, 0, 1))
            crop = full.crop(tuple(int(v) for v in box))
            reference = np.asarray(crop.resize((224, 224), Image.Resampling.BILINEAR))
            diff = np.abs(fused.astype(np.int16) - reference.astype(np.int16))
            assert diff.max() <= 1 and diff.mean() < 0.3, (k, box, diff.max(), diff.mean())


@pytest.mark.parametrize("decoder", ["pillow", "simplejpeg"])
def test_centre_crop_equals_resize_then_crop(decoder: str) -> None:
    for width, height in [(500, 375), (300, 420)]:
        data = encode(PHOTO.resize((width, height)), quality=90)
        full = Image.open(io.BytesIO(data)).convert("RGB")
        transform = ResizedCenterCrop(224, resize=256, decoder=decoder, output="numpy")
        new_w, new_h = transform.resized(width, height)
        assert min(new_w, new_h) == 256
        top, left = int(round((new_h - 224) / 2)), int(round((new_w - 224) / 2))
        resized = full.resize((new_w, new_h), Image.Resampling.BILINEAR)
        reference = np.asarray(resized.crop((left, top, left + 224, top + 224)), dtype=np.int16)
        diff = np.abs(transform(data).astype(np.int16) - reference)
        assert diff.mean() < 0.5 and diff.max() <= 1  # Pillow's fixed-point rounding only


def test_bad_arguments() -> None:
    with pytest.raises(PackerError, match="unknown decoder"):
        RandomResizedCrop(224, decoder="nvjpeg")
    with pytest.raises(PackerError, match="unknown output"):
        RandomResizedCrop(224, output="bytes")
    with pytest.raises(PackerError, match="size must be"):
        RandomResizedCrop((224, 0))
    with pytest.raises(PackerError, match="increasing"):
        RandomResizedCrop(224, scale=(1.0, 0.5))
    with pytest.raises(PackerError, match="resize must be"):
        ResizedCenterCrop(224, resize=200)


def test_dataloader_workers(packed: dict[str, Path]) -> None:
    transform = RandomResizedCrop(32, decoder="simplejpeg", seed=0)
    dataset = open_dataset(packed[".lmdb"], output="bytes", transform=transform)
    loader = DataLoader(dataset, batch_size=5, num_workers=2, multiprocessing_context="forkserver")
    images, labels = [], []
    for x, y in loader:
        images.append(x)
        labels.append(y)
    batch = torch.cat(images)
    assert batch.dtype == torch.uint8 and tuple(batch.shape) == (len(dataset), 3, 32, 32)
    assert torch.cat(labels).tolist() == dataset.targets.tolist()


def test_decoded_crop_draws_the_fused_crops_box_and_shares_it_across_a_clip() -> None:
    """The Pillow crop of decoded images (tools) samples with crop_params, as the fused one:
    with torch seeded alike, its output is exactly that box resized; a clip's frames share it."""
    from packer.diagnosis.train_transform import DecodedRandomResizedCrop

    frames = [PHOTO, PHOTO.transpose(Image.Transpose.FLIP_LEFT_RIGHT)]
    for seed in range(5):
        torch.manual_seed(seed)
        top, left, h, w = crop_params(PHOTO.width, PHOTO.height, (0.08, 1.0), (3 / 4, 4 / 3))
        torch.manual_seed(seed)
        out = DecodedRandomResizedCrop(48)(frames)
        box = (left, top, left + w, top + h)
        for frame, got in zip(frames, out):
            want = frame.resize((48, 48), Image.Resampling.BILINEAR, box=box, reducing_gap=None)
            assert got.size == (48, 48)
            assert np.array_equal(np.asarray(got), np.asarray(want))


def _gradient_jpeg(width: int, height: int) -> bytes:
    """Dark on the left, bright on the right: a flip shows as the sign of the slope."""
    row = np.linspace(0, 255, width).astype(np.uint8)
    return encode(Image.fromarray(np.repeat(np.tile(row, (height, 1))[:, :, None], 3, axis=2)))


def _left_darker(out: object) -> bool:
    array = np.asarray(out) if not isinstance(out, torch.Tensor) else out.permute(1, 2, 0).numpy()
    return int(array[:, :4].astype(int).sum()) < int(array[:, -4:].astype(int).sum())


@pytest.mark.parametrize("output", ["tensor", "numpy", "pil"])
@pytest.mark.parametrize("width", [400, 1600])  # torch's resize, and a DCT-scaled decode
def test_hflip_mirrors_the_crop_with_its_probability(output: str, width: int) -> None:
    data = _gradient_jpeg(width, width * 3 // 4)
    plain = RandomResizedCrop(32, output=output, seed=5, scale=(0.5, 1.0))(data)
    flipped = RandomResizedCrop(32, output=output, seed=5, scale=(0.5, 1.0), hflip=1.0)(data)
    a = np.asarray(plain) if output != "tensor" else plain.numpy()
    b = np.asarray(flipped) if output != "tensor" else flipped.numpy()
    assert np.array_equal(a[..., ::-1] if output == "tensor" else a[:, ::-1], b)  # same crop
    if output == "numpy":
        assert b.flags.writeable and b.flags.c_contiguous
    if output == "tensor":
        assert flipped.is_contiguous()
    half = RandomResizedCrop(16, output=output, seed=1, hflip=0.5)
    mirrored = sum(not _left_darker(half(data)) for _ in range(300))
    assert 110 <= mirrored <= 190  # 150 +- 4.9 sigma
    never = RandomResizedCrop(16, output=output, seed=1)
    assert all(_left_darker(never(data)) for _ in range(40))


def test_hflip_is_checked() -> None:
    with pytest.raises(PackerError, match="hflip"):
        RandomResizedCrop(32, hflip=2)
    assert "hflip=0.5" in repr(RandomResizedCrop(32, hflip=0.5))
