"""The fast JPEG decoders (simplejpeg, OpenCV, PyTurboJPEG where it loads): the same RGB pixels
as Pillow, a refusal (None) for what they do not handle so Pillow decodes it, the pixel limit,
clear errors for unknown and missing decoders, and real DataLoader workers in fresh processes
(forkserver: the dataset and its decoder choice pickled, as under spawn).

Tolerance against Pillow: mean absolute difference < 1.5 and no pixel off by more than 16 (IDCT
and upsampling implementations may differ between libjpeg builds; with the libjpeg-turbo builds
in the current wheels the pixels are identical)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from harness.damage import corrupted_scan
from PIL import Image
from torch.utils.data import DataLoader

from packer.decode import fast as fast_decoders
from packer.decode import registry as decoders
from packer.decode.outputs import decode
from packer.decode.registry import DECODERS, check_decoder, decoders_for
from packer.demo.image import DemoTree, photo_like
from packer.errors import PackerError
from packer.read.datasets import FolderDataset
from packer.read.open import open_dataset

AVAILABLE = fast_decoders.available()
# simplejpeg and OpenCV are in the `fast` extra CI installs: they are tested, never skipped.
# PyTurboJPEG needs libturbojpeg 3 from outside pip: tested wherever it loads.
NAMES = ["simplejpeg", "opencv"] + (["turbojpeg"] if "turbojpeg" in AVAILABLE else [])
MEAN_TOLERANCE, MAX_TOLERANCE = 1.5, 16


def jpeg(image: Image.Image, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", **options)
    return buffer.getvalue()


PHOTO = photo_like(np.random.default_rng(7), 401, 299)  # odd sizes: partial MCUs at the edges


def exif_rotated() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    return jpeg(PHOTO, exif=exif.tobytes())


ACCEPTED = {
    "baseline 4:2:0": jpeg(PHOTO, quality=90),
    "baseline 4:4:4": jpeg(PHOTO, quality=95, subsampling=0),
    "baseline 4:2:2": jpeg(PHOTO, quality=75, subsampling=1),
    "progressive": jpeg(PHOTO, progressive=True),
    "grayscale": jpeg(PHOTO.convert("L")),
    "exif rotated": exif_rotated(),
}
REFUSED = {
    "cmyk": jpeg(PHOTO.convert("CMYK")),
    "png": (lambda b: (PHOTO.save(b, format="PNG"), b.getvalue())[1])(io.BytesIO()),
}


def assert_close(pixels: np.ndarray, reference: np.ndarray) -> None:
    assert pixels.shape == reference.shape and pixels.dtype == np.uint8
    diff = np.abs(pixels.astype(np.int16) - reference.astype(np.int16))
    assert diff.mean() < MEAN_TOLERANCE and diff.max() <= MAX_TOLERANCE


def test_the_ci_decoders_load() -> None:
    assert {"simplejpeg", "opencv"} <= set(AVAILABLE)
    assert [d.name for d in decoders_for("jpeg")][-1] == "pillow"
    assert [d.name for d in decoders_for("jpeg")][0] == "simplejpeg"  # the measured fastest


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_same_pixels_as_pillow(name: str, case: str) -> None:
    data = ACCEPTED[case]
    raw = AVAILABLE[name](data, decoders.MAX_PIXELS)
    assert raw is not None  # the fast decoder did the work, not the Pillow fallback
    reference = decode(data, "numpy", "pillow")
    assert reference.shape == (299, 401, 3)  # EXIF orientation ignored: not 401 rows
    assert_close(raw, reference)
    assert_close(decode(data, "numpy", name), reference)
    assert_close(decode(memoryview(data), "numpy", name), reference)
    assert decode(data, "pil", name).mode == "RGB"
    assert tuple(decode(data, "tensor", name).shape) == (3, 299, 401)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_data_falls_back_to_pillow(name: str, case: str) -> None:
    data = REFUSED[case]
    assert AVAILABLE[name](data, decoders.MAX_PIXELS) is None
    reference = decode(data, "numpy", "pillow")
    assert np.array_equal(decode(data, "numpy", name), reference)
    assert np.array_equal(decode(data, "numpy", "auto"), reference)


@pytest.mark.parametrize("name", NAMES)
def test_a_refusing_library_leaves_the_verdict_to_pillow(name: str) -> None:
    good = ACCEPTED["baseline 4:2:0"]
    truncated = good[: len(good) // 2]
    try:
        assert AVAILABLE[name](truncated, decoders.MAX_PIXELS) is None
    except fast_decoders.DecodeFailed:
        pass
    with pytest.raises((OSError, ValueError)):
        decode(truncated, "numpy", name)  # Pillow's error, never grey padding


def test_a_corrupt_scan_rejected_by_simplejpeg_is_not_handed_to_opencv() -> None:
    corrupt = corrupted_scan(ACCEPTED["baseline 4:2:0"])  # markers amid the scan
    with pytest.raises(fast_decoders.DecodeFailed):
        AVAILABLE["simplejpeg"](corrupt, decoders.MAX_PIXELS)
    for name in ("auto", "simplejpeg", "pillow"):
        with pytest.raises((OSError, ValueError)):
            decode(corrupt, "numpy", name)


@pytest.mark.parametrize("name", NAMES)
def test_pixel_limit_checked_from_the_header(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decoders, "MAX_PIXELS", 401 * 299 - 1)
    with pytest.raises(ValueError, match="over the 119,898 px limit"):
        decode(ACCEPTED["baseline 4:2:0"], "numpy", name)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("denom", fast_decoders.DENOMS)
def test_dct_scaled_decode(name: str, denom: int) -> None:
    pixels = AVAILABLE[name](ACCEPTED["baseline 4:2:0"], decoders.MAX_PIXELS, denom)
    assert pixels is not None and pixels.shape == (-(-299 // denom), -(-401 // denom), 3)
    image = Image.open(io.BytesIO(ACCEPTED["baseline 4:2:0"]))
    image.draft("RGB", (401 // denom, 299 // denom))
    assert_close(pixels, np.asarray(image.convert("RGB")))


def test_jpeg_info_reads_the_frame_header() -> None:
    info = fast_decoders.jpeg_info(ACCEPTED["progressive"])
    assert info is not None and (info.width, info.height, info.sof) == (401, 299, 0xC2)
    assert info.plain
    cmyk = fast_decoders.jpeg_info(REFUSED["cmyk"])
    assert cmyk is not None and cmyk.components == 4 and not cmyk.plain
    assert fast_decoders.jpeg_info(REFUSED["png"]) is None
    assert fast_decoders.jpeg_info(b"\xff\xd8\xff") is None


def test_unknown_decoder_names_the_valid_ones(tree: DemoTree) -> None:
    with pytest.raises(PackerError, match="unknown decoder 'nvjpeg'.*opencv, pillow, simplejpeg"):
        check_decoder("nvjpeg")
    with pytest.raises(PackerError, match="unknown decoder 'nvjpeg'"):
        FolderDataset(tree.root, decoder="nvjpeg")


@pytest.fixture
def without_simplejpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if simplejpeg were not installed (the registry rebuilt from scratch)."""

    def not_installed() -> fast_decoders.FastDecoder:
        raise ModuleNotFoundError("No module named 'simplejpeg'", name="simplejpeg")

    monkeypatch.setitem(fast_decoders._LOADERS, "simplejpeg", (not_installed, "simplejpeg"))
    for module, name, value in [
        (fast_decoders, "_TRIED", False),
        (fast_decoders, "_LOADED", {}),
        (fast_decoders, "MISSING", {}),
        (decoders, "_FAST_REGISTERED", False),
        (decoders, "_CHAINS", {}),
        (decoders, "DECODERS", {k: v for k, v in DECODERS.items() if k not in AVAILABLE}),
    ]:
        monkeypatch.setattr(module, name, value)


@pytest.mark.usefixtures("without_simplejpeg")
def test_a_missing_decoder_says_what_to_install(packed: dict[str, Path]) -> None:
    with pytest.raises(PackerError, match=r"'simplejpeg' is not available.*pip install"):
        check_decoder("simplejpeg")
    with pytest.raises(PackerError, match="simplejpeg is not installed"):
        open_dataset(packed[".lmdb"], decoder="simplejpeg")
    assert "simplejpeg" not in [d.name for d in decoders_for("jpeg")]  # auto: the others
    assert decode(ACCEPTED["grayscale"], "numpy").shape == (299, 401, 3)


def test_turbojpeg_loads_or_explains_why() -> None:
    if "turbojpeg" in AVAILABLE:
        assert check_decoder("turbojpeg") == "turbojpeg"
    else:
        with pytest.raises(PackerError, match="'turbojpeg' is not available: PyTurboJPEG"):
            check_decoder("turbojpeg")


def test_video_dataset_takes_a_decoder(tmp_path: Path) -> None:
    from packer.read.video_datasets import FolderVideoDataset

    for video in ("a/v0", "b/v1"):
        (tmp_path / video).mkdir(parents=True)
        for frame in range(3):
            (tmp_path / video / f"{frame:03d}.jpg").write_bytes(ACCEPTED["grayscale"])
    dataset = FolderVideoDataset(tmp_path, num_frames=2, output="numpy", decoder="opencv")
    clip, label = dataset[1]
    assert clip.shape == (2, 299, 401, 3) and label == 1 and "decoder='opencv'" in repr(dataset)
    with pytest.raises(PackerError, match="unknown decoder"):
        FolderVideoDataset(tmp_path, decoder="jpeg")


@pytest.mark.parametrize("suffix", [".lmdb", "folder"])
def test_dataloader_fresh_workers_decode_like_pillow(
    suffix: str, tree: DemoTree, packed: dict[str, Path]
) -> None:
    good = {str(p) for p in tree.good}

    def open_one(decoder: str) -> FolderDataset:
        if suffix == "folder":
            return FolderDataset(
                tree.root, output="tensor", is_valid_file=good.__contains__, decoder=decoder
            )
        return open_dataset(packed[suffix], output="tensor", decoder=decoder)

    reference = open_one("pillow")
    loader = DataLoader(
        open_one("simplejpeg"), batch_size=4, num_workers=2, multiprocessing_context="forkserver"
    )
    images, labels = zip(*[(x, y) for xs, ys in loader for x, y in zip(xs, ys)])
    assert len(images) == len(reference)
    for i, (image, label) in enumerate(zip(images, labels)):
        expected, expected_label = reference[i]
        assert int(label) == expected_label
        assert_close(image.permute(1, 2, 0).numpy(), expected.permute(1, 2, 0).numpy())
    assert isinstance(images[0], torch.Tensor)
