"""The storage core under attack: map growth, empty planned shards, names that are not UTF-8,
reads from several threads, and the allocator setting readers make."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.decode.outputs import decode
from packer.demo.image import DemoTree, make_image_tree
from packer.demo.video import make_video_tree
from packer.formats import lmdb as lmdb_format
from packer.read.verify import verify
from packer.source.images import natural_key


def source_bytes(tree: DemoTree) -> dict[str, bytes]:
    return {f"{p.parent.name}/{p.stem}": p.read_bytes() for p in tree.good}


@pytest.mark.parametrize("kind", ["image", "video"])
def test_lmdb_map_really_grows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """A map far smaller than the data: the writer must grow it (counted) and lose nothing."""
    grows: list[int] = []
    real = lmdb_format.Writer._grow_and_replay

    def counted(self: lmdb_format.Writer) -> None:
        grows.append(self._env.info()["map_size"])
        real(self)

    monkeypatch.setattr(lmdb_format, "initial_map_size", lambda planned: 64 * 1024)
    monkeypatch.setattr(lmdb_format.Writer, "_grow_and_replay", counted)
    if kind == "image":
        tree = make_image_tree(tmp_path / "src", classes=2, per_class=6, size=(256, 192))
        src, expected = tree.root, source_bytes(tree)
    else:
        video = make_video_tree(tmp_path / "src", classes=2, per_class=2, size=(160, 120))
        src = video.root
    dst = tmp_path / "small.lmdb"
    packer.convert(src, dst, workers=1, progress=False)
    assert grows, "the map never filled: the growth path was not run"
    assert verify(dst, progress=False).ok
    dataset = packer.open_dataset(dst, output="bytes")
    if kind == "image":
        assert sum(len(v) for v in expected.values()) > 64 * 1024
        assert [dataset[i][0] for i in range(len(dataset))] == [expected[k] for k in dataset.keys]
    else:
        folders = {
            k: sorted((src / k).iterdir(), key=lambda p: natural_key(p.name)) for k in dataset.keys
        }
        for i, key in enumerate(dataset.keys):
            frames = np.arange(len(folders[key]))
            assert dataset.read_frames(i, frames) == [p.read_bytes() for p in folders[key]]


def test_a_whole_planned_shard_skipped(tree: DemoTree, tmp_path: Path, suffix: str) -> None:
    """One sample per planned shard: the broken file's shard is empty and never listed."""
    dst = tmp_path / f"out{suffix}"
    result = packer.convert(tree.root, dst, shard_size=1, workers=2, progress=False)
    planned = len(tree.good) + len(tree.bad)
    if suffix != ".bmp":
        assert len(result.manifest.shards) == planned - len(tree.bad)
    assert verify(dst, progress=False).ok
    output = "numpy" if suffix == ".bmp" else "bytes"  # BMP stores decoded pixels
    dataset = packer.open_dataset(dst, output=output)
    expected = source_bytes(tree)
    assert sorted(dataset.keys) == sorted(expected)
    for i, key in enumerate(dataset.keys):
        want = decode(expected[key], "numpy") if suffix == ".bmp" else expected[key]
        assert np.array_equal(dataset[i][0], want) if suffix == ".bmp" else dataset[i][0] == want


def test_names_that_are_not_utf8_round_trip(tree: DemoTree, tmp_path: Path, suffix: str) -> None:
    root = tmp_path / "src"
    weird_class = os.fsdecode(b"caf\xe9")  # latin-1 bytes: not valid UTF-8
    for cls in ("plain", weird_class):
        os.makedirs(root / cls)
    data = tree.good[0].read_bytes()
    names = [b"na\xefve.jpg", b"ok.jpg"]
    for cls in ("plain", weird_class):
        for name in names:
            (root / cls / os.fsdecode(name)).write_bytes(data)
    (root / "plain" / os.fsdecode(b"junk\xff.txt")).write_bytes(b"not an image")
    dst = tmp_path / f"out{suffix}"
    packer.convert(root, dst, workers=2, progress=False)
    dataset = packer.open_dataset(dst, output="bytes")
    assert set(dataset.classes) == {"plain", weird_class}
    assert sorted(dataset.keys) == sorted(
        f"{c}/{os.fsdecode(n)[:-4]}" for c in ("plain", weird_class) for n in names
    )
    if suffix == ".bmp":  # stored decoded
        pixels = decode(data, "numpy")
        assert all(np.array_equal(decode(dataset[i][0], "numpy"), pixels) for i in range(4))
    else:
        assert all(dataset[i][0] == data for i in range(len(dataset)))
    assert verify(dst, progress=False).ok


def test_reads_from_several_threads(packed: dict[str, Path], suffix: str) -> None:
    dataset = packer.open_dataset(packed[suffix], output="bytes")
    serial = [dataset[i][0] for i in range(len(dataset))]
    rng = random.Random(0)
    batches = [rng.sample(range(len(dataset)), k=min(5, len(dataset))) for _ in range(200)]

    def read(batch: list[int]) -> bool:
        got = [pair[0] for pair in dataset.__getitems__(batch)]
        single = [dataset[i][0] for i in batch]
        return got == single == [serial[i] for i in batch]

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(read, batches))


ALLOCATOR = """
import os, resource, sys
import packer
ds = packer.open_dataset(sys.argv[1], output="bytes")
ds[0]  # a reader opens its first handle: this is where packer tunes malloc
def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()
blobs = [bytes(100_000) for _ in range(300)]  # 30 MB in heap-sized pieces
high = rss()
del blobs
print(high - rss())
"""


def test_readers_keep_freed_heap_unless_told_not_to(packed: dict[str, Path]) -> None:
    """Readers raise glibc's trim threshold (freed batches stay mapped, no page-fault storm);
    ``PACKER_NO_MALLOPT=1`` leaves malloc alone, so the same frees return memory at once."""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's M_TRIM_THRESHOLD exists on Linux only")

    def released(no_mallopt: bool) -> int:
        env = {k: v for k, v in os.environ.items() if k != "PACKER_NO_MALLOPT"}
        if no_mallopt:
            env["PACKER_NO_MALLOPT"] = "1"
        cmd = [sys.executable, "-c", ALLOCATOR, str(packed[".npy"])]
        return int(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)

    trimmed, kept = released(no_mallopt=True), released(no_mallopt=False)
    assert trimmed > 15_000_000, trimmed  # most of the 30 MB went back to the system
    assert kept < 5_000_000, kept  # kept for the next batch
