"""Clips read only their sampled frames: same bytes as the source for every sampling mode, at most
the payload plus a few pages from a cold disk, and a bounded number of open descriptors."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data import DataLoader

import packer
from packer.decode.outputs import decode
from packer.formats.files import OpenFile, coalesce, read_ranges, read_ranges_into
from packer.read.clip_frames import SAMPLINGS

LENGTHS = (1, 2, 3, 17, 64, 500)
CLIP_FORMATS = (".npy", ".h5", ".lmdb", ".bmp")


def noise_jpeg(rng: np.random.Generator, width: int, height: int, quality: int = 85) -> bytes:
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(out, format="JPEG", quality=quality)
    return out.getvalue()


def write_videos(
    root: Path, lengths: list[int], size: tuple[int, int] | None, seed: int = 0
) -> dict[str, list[bytes]]:
    """``root/class_X/video_NNN/img_00001.jpg ...``; frames of varying byte length (so the NPY
    rows are padded) unless ``size`` fixes them. Returns each video key's frames in order."""
    rng = np.random.default_rng(seed)
    videos = {}
    for v, count in enumerate(lengths):
        key = f"class_{v % 2}/video_{v:04d}"
        folder = root / key
        folder.mkdir(parents=True)
        frames = []
        for j in range(count):
            w, h = size or (int(rng.integers(8, 40)), int(rng.integers(8, 40)))
            data = noise_jpeg(rng, w, h)
            (folder / f"img_{j + 1:05d}.jpg").write_bytes(data)
            frames.append(data)
        videos[key] = frames
    return videos


@pytest.fixture(scope="module")
def clips(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, list[bytes]], dict[str, Path]]:
    root = tmp_path_factory.mktemp("clips")
    videos = write_videos(root / "frames", list(LENGTHS), None)
    packed = {}
    for suffix in CLIP_FORMATS:
        packed[suffix] = root / f"v{suffix}"
        packer.convert(root / "frames", packed[suffix], shard_size="200kB", progress=False)
    return videos, packed


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    video=st.integers(0, len(LENGTHS) - 1),
    num_frames=st.integers(1, 40),
    sampling=st.sampled_from(SAMPLINGS),
    stride=st.integers(1, 6),
    seed=st.integers(0, 1000),
)
def test_positioned_reads_return_the_sampled_frames(
    clips: tuple[dict[str, list[bytes]], dict[str, Path]],
    video: int,
    num_frames: int,
    sampling: str,
    stride: int,
    seed: int,
) -> None:
    videos, packed = clips
    for suffix in (".npy", ".h5", ".lmdb"):
        dataset = packer.open_dataset(
            packed[suffix],
            num_frames=num_frames,
            sampling=sampling,
            stride=stride,
            seed=seed,
            output="bytes",
        )
        key = dataset.keys[video]
        wanted = dataset.clip_indices(video)
        clip, label = dataset[video]
        assert clip == [videos[key][j] for j in wanted]
        assert label == dataset.class_to_idx[key.split("/")[0]]


def test_every_frame_of_every_video(clips: tuple[dict[str, list[bytes]], dict[str, Path]]) -> None:
    videos, packed = clips
    for suffix in CLIP_FORMATS:
        dataset = packer.open_dataset(packed[suffix], output="bytes")
        for i, key in enumerate(dataset.keys):
            got = dataset.read_frames(i, np.arange(len(videos[key])))
            if suffix == ".bmp":  # decoded: compare pixels
                assert [decode(g, "numpy").shape[:2] for g in got] == [
                    Image.open(io.BytesIO(f)).size[::-1] for f in videos[key]
                ]
            else:
                assert got == videos[key]


def test_ranges_coalesce_and_fill_a_buffer(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 64  # 16 KiB
    path = tmp_path / "f.bin"
    path.write_bytes(payload)
    starts, lengths = [0, 10, 5000, 5100, 15000], [10, 20, 100, 50, 1384]
    assert coalesce(starts, lengths) == [(0, 30, 0, 2), (5000, 5150, 2, 4), (15000, 16384, 4, 5)]
    handle = OpenFile(path)
    try:
        expected = [payload[a : a + n] for a, n in zip(starts, lengths)]
        assert read_ranges(handle, starts, lengths) == expected
        where = np.concatenate(([0], np.cumsum(lengths)[:-1])).tolist()
        out = bytearray(sum(lengths))
        read_ranges_into(handle, starts, lengths, memoryview(out), where)
        assert bytes(out) == b"".join(expected)
        with pytest.raises(packer.FormatError, match="truncated"):
            read_ranges(handle, [16000], [1000])
    finally:
        handle.close()


def read_bytes() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("read_bytes:"))


def evict(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def disk_reads_are_counted(tmp_path: Path) -> bool:
    probe = tmp_path / "probe.bin"
    probe.write_bytes(os.urandom(1 << 20))
    os.sync()
    evict(tmp_path)
    before = read_bytes()
    probe.read_bytes()
    return read_bytes() - before >= 1 << 19


@pytest.mark.parametrize("suffix", [".npy", ".h5", ".lmdb"])
def test_cold_clip_reads_its_payload_and_a_few_pages(tmp_path: Path, suffix: str) -> None:
    if not os.path.exists("/proc/self/io") or not disk_reads_are_counted(tmp_path):
        pytest.skip("this file system does not count block reads in /proc/self/io (tmpfs?)")
    write_videos(tmp_path / "frames", [60, 60], (160, 120))
    dst = tmp_path / f"v{suffix}"
    packer.convert(tmp_path / "frames", dst, progress=False)
    dataset = packer.open_dataset(dst, num_frames=8, sampling="segments", seed=1, output="bytes")
    clip, _ = dataset[1]  # warm the tables; then start cold for the data
    evict(dst)
    fresh = packer.open_dataset(dst, num_frames=8, sampling="segments", seed=1, output="bytes")
    before = read_bytes()
    clip, _ = fresh[0]
    disk = read_bytes() - before
    payload = sum(len(f) for f in clip)
    pages = 2 * len(clip) + (12 if suffix == ".lmdb" else 2)  # range ends; B-tree pages
    assert payload > 8 * 4096  # frames are large enough for the bound to mean something
    assert disk <= payload + pages * 4096, (disk, payload)


class CountingClips(packer.NPYVideoDataset):
    """Returns, with each clip, how many descriptors this worker's reader holds open."""

    def __getitem__(self, i: int) -> tuple:
        clip, label = super().__getitem__(i)
        return len(self.reader.handles), len(os.listdir("/proc/self/fd"))


def test_descriptor_cache_bounded_over_a_thousand_videos(tmp_path: Path) -> None:
    write_videos(tmp_path / "frames", [2] * 1000, (8, 8))
    dst = tmp_path / "v.npy"
    packer.convert(tmp_path / "frames", dst, progress=False)
    dataset = CountingClips(dst, num_frames=2, output="bytes", max_open_files=32)
    loader = DataLoader(
        dataset,
        batch_size=50,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=list,
    )
    seen = [item for batch in loader for item in batch]
    assert len(seen) == 1000
    handles = [h for h, _ in seen]
    fds = [f for _, f in seen]
    assert max(handles) == 32  # the cache filled up and stayed at its bound
    others = [f - h for h, f in seen]  # descriptors that are not the cache's
    assert max(others) - min(others) <= 4  # ... stay flat: nothing leaks per video
    assert max(fds) < min(fds) + 40
