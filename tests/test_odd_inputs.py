"""One input never stops a conversion: a generated corpus of odd-but-valid and broken images
(harness.damage.odd_images) through every format, as images and as video frames, with
default and resize options; each file kept intact or skipped with its reason. And at read time,
whatever a decoder raises on bad bytes is an InputFileError naming the sample."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from harness.damage import OddImage, odd_images, png_bomb
from PIL import Image

import packer
from packer.decode.pixels import to_pixels
from packer.decode.registry import decoders_for, pillow_rgb
from packer.decode.resize import resize_to
from packer.errors import InputFileError, PackerError
from packer.write.loading import Loaded, load_in_order

CORPUS = odd_images()
BY_NAME = {c.name: c for c in CORPUS}
FRAMES = [c for c in CORPUS if c.name.endswith(".jpg")]  # frame folders hold JPEGs
SUFFIXES = (".lmdb", ".h5", ".npy", ".bmp")


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``odd/<case>``: one class holding every case of the corpus."""
    root = tmp_path_factory.mktemp("odd") / "images"
    (root / "odd").mkdir(parents=True)
    for case in CORPUS:
        (root / "odd" / case.name).write_bytes(case.data)
    return root


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``odd/<case>/img_1.jpg, img_2.jpg``: one video per JPEG case, its two frames that case."""
    root = tmp_path_factory.mktemp("odd") / "videos"
    for case in FRAMES:
        folder = root / "odd" / case.name.removesuffix(".jpg")
        folder.mkdir(parents=True)
        for frame in ("img_1.jpg", "img_2.jpg"):
            (folder / frame).write_bytes(case.data)
    return root


def _outcomes(result: packer.ConvertResult, cases: list[OddImage], video: bool) -> dict:
    """Each case's skip reason (None: kept), checking every skip names its file."""
    reasons: dict[str, str | None] = {}
    skipped = {Path(s.path).name: s.reason for s in result.skipped}
    assert [s["reason"] for s in result.manifest.skipped] == [s.reason for s in result.skipped]
    for case in cases:
        name = case.name.removesuffix(".jpg") if video else case.name
        reason = skipped.pop(name, None)
        if reason is not None and video:  # the video is skipped for its first frame
            assert f"{name}/img_1.jpg" in reason, reason
        reasons[case.name] = reason
    assert not skipped, f"skipped inputs outside the corpus: {skipped}"
    return reasons


def _assert_expected(reasons: dict, cases: list[OddImage]) -> list[OddImage]:
    """Every case kept or skipped as expected (with its reason); returns the kept ones."""
    wrong = {
        c.name: reasons[c.name]
        for c in cases
        if c.kept != (reasons[c.name] is None) or (not c.kept and c.reason not in reasons[c.name])
    }
    assert not wrong, f"unexpected outcome (name: skip reason): {wrong}"
    assert all(reasons[c.name] for c in cases if not c.kept)  # a reason, never empty
    return [c for c in cases if c.kept]


def _stored(dataset: packer.ImageDataset, key: str) -> bytes:
    return dataset[list(dataset.keys).index(key)][0]


def _rgb(data: bytes) -> np.ndarray:
    return np.asarray(pillow_rgb(data))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_odd_image_is_kept_intact_or_skipped_with_its_reason(
    images: Path, tmp_path: Path, suffix: str
) -> None:
    result = packer.convert(images, tmp_path / f"out{suffix}", workers=2, progress=False)
    kept = _assert_expected(_outcomes(result, CORPUS, False), CORPUS)
    dataset = packer.open_dataset(tmp_path / f"out{suffix}", output="bytes")
    assert len(dataset) == len(kept)
    for case in kept:
        stored = _stored(dataset, f"odd/{Path(case.name).stem}")
        if suffix == ".bmp":  # transcoded: the pixels every reader decodes from the source
            assert np.array_equal(_rgb(stored), _rgb(case.data)), case.name
        else:
            assert stored == case.data, case.name


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_odd_images_resized_keep_their_shape_rules(
    images: Path, tmp_path: Path, suffix: str
) -> None:
    dst = tmp_path / f"small{suffix}"
    result = packer.convert(images, dst, workers=1, progress=False, max_side=8)
    kept = _assert_expected(_outcomes(result, CORPUS, False), CORPUS)
    dataset = packer.open_dataset(dst, output="bytes")
    for case in kept:
        stored = _stored(dataset, f"odd/{Path(case.name).stem}")
        source = pillow_rgb(case.data)
        expected = resize_to(source.width, source.height, 8, None)
        assert pillow_rgb(stored).size == expected, case.name
        if expected == source.size and suffix != ".bmp":  # within the limit: bytes kept
            assert stored == case.data, case.name


def test_odd_images_as_fixed_size_pixels(images: Path, tmp_path: Path) -> None:
    result = packer.convert(images, tmp_path / "px.npy", size=8, workers=2, progress=False)
    kept = _assert_expected(_outcomes(result, CORPUS, False), CORPUS)
    dataset = packer.open_dataset(tmp_path / "px.npy", output="numpy")
    for case in kept:
        pixels = _stored(dataset, f"odd/{Path(case.name).stem}")
        expected = np.frombuffer(to_pixels(case.data, 8), np.uint8).reshape(8, 8, 3)
        assert np.array_equal(pixels, expected), case.name


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("max_side", [None, 8])
def test_every_odd_frame_keeps_or_skips_its_video(
    videos: Path, tmp_path: Path, suffix: str, max_side: int | None
) -> None:
    dst = tmp_path / f"clips{suffix}"
    options = {"max_side": max_side} if max_side else {}
    result = packer.convert(videos, dst, workers=2, progress=False, **options)
    kept = _assert_expected(_outcomes(result, FRAMES, True), FRAMES)
    dataset = packer.open_dataset(dst, num_frames=2, output="bytes")
    keys = list(dataset.keys)
    assert sorted(keys) == sorted(f"odd/{c.name.removesuffix('.jpg')}" for c in kept)
    for case in kept:
        i = keys.index(f"odd/{case.name.removesuffix('.jpg')}")
        frames = dataset.read_frames(i, np.arange(2))
        source = pillow_rgb(case.data)
        for frame in frames:
            if max_side:
                assert pillow_rgb(frame).size == resize_to(*source.size, max_side, None)
            elif suffix == ".bmp":
                assert np.array_equal(_rgb(frame), _rgb(case.data)), case.name
            else:
                assert bytes(frame) == case.data, case.name


@pytest.fixture(scope="module")
def video_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """``odd/<name>.mp4`` (PyAV): tiny frames, and a clip cut at four lengths; with the
    number of frames each kept video holds."""
    from packer.demo.video import pan_frames, write_video

    root = tmp_path_factory.mktemp("odd") / "files"
    (root / "odd").mkdir(parents=True)
    kept = {}
    for w, h in ((2, 2), (8, 6), (2, 40)):  # yuv420p: even sides
        write_video(root / "odd" / f"tiny_{w}x{h}.mp4", [Image.new("RGB", (w, h))] * 3)
        kept[f"tiny_{w}x{h}"] = 3
    write_video(root / "odd" / "whole.mp4", pan_frames(np.random.default_rng(0), 5, (64, 48)))
    kept["whole"] = 5
    data = (root / "odd" / "whole.mp4").read_bytes()
    for length in (0, 10, len(data) // 2, len(data) - 10):
        (root / "odd" / f"cut_{length:05d}.mp4").write_bytes(data[:length])
    kept[f"cut_{len(data) - 10:05d}"] = 0  # its index is intact: some or all frames decode
    return root, kept


@pytest.mark.parametrize("suffix,max_side", [(s, None) for s in SUFFIXES] + [(".lmdb", 8)])
def test_video_files_of_odd_sizes_or_cut_short(
    video_files: tuple[Path, dict[str, int]], tmp_path: Path, suffix: str, max_side: int | None
) -> None:
    root, kept = video_files
    dst = tmp_path / f"files{suffix}"
    options = {"max_side": max_side} if max_side else {}
    result = packer.convert(root, dst, workers=2, progress=False, **options)
    skipped = {Path(s.path).stem: s.reason for s in result.skipped}
    assert set(skipped) == {p.stem for p in (root / "odd").iterdir()} - set(kept)
    assert all("PyAV cannot decode it" in reason for reason in skipped.values())
    dataset = packer.open_dataset(dst, num_frames=1, output="bytes")
    assert sorted(dataset.keys) == sorted(f"odd/{name}" for name in kept)
    for i, key in enumerate(dataset.keys):
        frames = dataset.read_frames(i, np.arange(dataset.counts[i]))
        assert len(frames) == kept[key[4:]] or (kept[key[4:]] == 0 and 0 < len(frames) <= 5)
        w, h = (64, 48) if not key.startswith("odd/tiny") else map(int, key[9:].split("x"))
        assert {pillow_rgb(f).size for f in frames} == {resize_to(w, h, max_side, None)}


# --- the loading pool: an exception of any type from one input skips that input -------------


class _Unpicklable(Exception):
    def __init__(self, a: str, b: str) -> None:  # pickled as (a,): cannot be rebuilt
        super().__init__(a)


def _loader(sample: str) -> Loaded:
    """A loader for the pool: ``sample`` names what happens to it (most load as their name)."""
    if sample == "zero":
        return Loaded([bytes(1 // len(""))])  # a library's ZeroDivisionError, say
    if sample == "unpicklable":
        raise _Unpicklable("odd", "state")
    if sample == "packer":
        raise PackerError("PyAV is not installed")  # every input would fail: the run stops
    if sample == "memory":
        raise MemoryError
    return Loaded([sample.encode()])


@pytest.mark.parametrize("workers,cpu_bound", [(1, False), (2, False), (2, True)])
def test_the_pool_skips_an_input_whose_loader_raises_anything(
    workers: int, cpu_bound: bool
) -> None:
    samples = ["a", "zero", "b", "unpicklable", "c"]
    out = list(load_in_order(_loader, samples, workers, cpu_bound))
    assert [o.records for o in out] == [[b"a"], None, [b"b"], None, [b"c"]]
    assert (
        out[1].reason == "unexpected error: ZeroDivisionError: integer division or modulo by zero"
    )
    assert out[3].reason == "unexpected error: _Unpicklable: odd"
    for fatal, kind in (("packer", PackerError), ("memory", MemoryError)):
        with pytest.raises(kind):
            list(load_in_order(_loader, ["a", fatal, "b"], workers, cpu_bound))


# --- read time: whatever a decoder raises on bad bytes is the sample's InputFileError ---------


@pytest.fixture
def small_and_large(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    for name, size, fmt in (("big", (64, 48), "JPEG"), ("png", (64, 48), "PNG")):
        buffer = io.BytesIO()
        Image.new("RGB", size, (90, 20, 200)).save(buffer, fmt)
        (root / "a" / f"{name}.{fmt.lower()}").write_bytes(buffer.getvalue())
    Image.new("RGB", (8, 8), (1, 2, 3)).save(root / "a" / "small.jpg")
    packer.convert(root, tmp_path / "out.lmdb", progress=False, workers=1)
    return tmp_path / "out.lmdb"


@pytest.mark.parametrize("decoder", ["pillow", "auto"])
def test_a_decompression_bomb_at_read_time_is_the_samples_error(
    small_and_large: Path, monkeypatch: pytest.MonkeyPatch, decoder: str
) -> None:
    """Pillow's own limit (``PIL.Image.MAX_IMAGE_PIXELS``, which a training script may lower)
    makes every image over twice it a DecompressionBombError: the dataset names the sample,
    and ``on_error="skip"`` serves the next decodable one."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # 64×48 > 2000 px: a "bomb" now
    strict = packer.open_dataset(small_and_large, output="numpy", decoder=decoder)
    keys = list(strict.keys)
    fast = len(decoders_for("jpeg", decoder)) > 1  # a fast JPEG decoder knows only packer's
    bombs = ["a/png"] if fast else ["a/big", "a/png"]  # limit: the JPEG is no bomb to it
    for key in bombs:
        with pytest.raises(InputFileError, match=f"{key}.*decompression bomb"):
            strict[keys.index(key)]
    lenient = packer.open_dataset(small_and_large, output="numpy", decoder=decoder, on_error="skip")
    for key in bombs:  # the next decodable sample stands in: a/small
        assert lenient[keys.index(key)][0].shape == (8, 8, 3)
    assert lenient.replaced == len(bombs)


def test_a_bomb_through_a_decoding_transform_is_the_samples_error(
    small_and_large: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packer.decode.transforms import RandomResizedCrop

    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    crop = RandomResizedCrop(4, decoder="pillow", seed=0)
    strict = packer.open_dataset(small_and_large, output="bytes", transform=crop)
    big = list(strict.keys).index("a/big")
    with pytest.raises(InputFileError, match="a/big.*decompression bomb"):
        strict[big]
    lenient = packer.open_dataset(small_and_large, output="bytes", transform=crop, on_error="skip")
    assert tuple(lenient[big][0].shape) == (3, 4, 4) and lenient.replaced >= 1


def test_a_stored_png_bomb_is_the_samples_error_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Converted where Pillow's limit was lifted and --max-pixels generous, read with the
    defaults: the stored bytes are a real bomb (200 Mpx in a few kB)."""
    root = tmp_path / "src"
    (root / "a").mkdir(parents=True)
    (root / "a" / "bomb.png").write_bytes(png_bomb())
    Image.new("RGB", (8, 8), (1, 2, 3)).save(root / "a" / "small.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    dst = tmp_path / "out.lmdb"
    packer.convert(root, dst, check="fast", max_pixels=300_000_000, workers=1, progress=False)
    monkeypatch.undo()  # Pillow's default limit again
    strict = packer.open_dataset(dst, output="numpy")
    assert list(strict.keys) == ["a/bomb", "a/small"]
    with pytest.raises(InputFileError, match="a/bomb.*decompression bomb"):
        strict[0]
    lenient = packer.open_dataset(dst, output="numpy", on_error="skip")
    assert lenient[0][0].shape == (8, 8, 3) and lenient.replaced == 1
