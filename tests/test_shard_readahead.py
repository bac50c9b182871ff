"""How mapped image shards are read from disk (``packer.formats.files.shard_readahead``): a whole
shard is put in flight at its first touch when the image dataset fits half the available memory,
so a cold shuffled epoch reads each byte of the dataset from disk about once, in big requests.
Real JPEGs, real NPY/HDF5 outputs, real page-cache eviction; disk bytes from ``/proc/self/io``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.diagnosis.targets import data_files, evict_page_cache
from packer.formats.files import shard_readahead


def read_bytes() -> int:
    with open("/proc/self/io") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("read_bytes:"))


def disk_reads_are_counted(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.write_bytes(os.urandom(1 << 20))
    evict_page_cache([probe])
    before = read_bytes()
    probe.read_bytes()
    return read_bytes() - before >= 1 << 19


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~24 MB of large photo-like JPEGs: more than one 8 MB readahead window of the disk."""
    root = tmp_path_factory.mktemp("shards") / "images"
    make_image_tree(root, classes=2, per_class=40, size=(900, 800), quality=95, bad=0)
    return root


def test_the_rule_for_images_video_and_datasets_beyond_the_memory_bound() -> None:
    gib = 1 << 30
    assert shard_readahead(None, "image", gib, 4 * gib) == "whole"
    assert shard_readahead(None, "image", 2 * gib, 4 * gib) == "whole"  # exactly half
    assert shard_readahead(None, "image", 2 * gib + 1, 4 * gib) == "kernel"  # beyond half
    assert shard_readahead(None, "image", gib, None) == "kernel"  # memory unknown
    assert shard_readahead(None, "video", 1, 4 * gib) == "kernel"  # clips: never whole
    assert shard_readahead(True, "image", 8 * gib, 4 * gib) == "whole"  # the option overrides
    assert shard_readahead(False, "image", 1, 4 * gib) == "exact"


@pytest.mark.parametrize("suffix", [".npy", ".h5"])
def test_reader_options_decide_the_policy(images: Path, tmp_path: Path, suffix: str) -> None:
    dst = images.parent / f"images{suffix}"
    if not dst.exists():
        packer.convert(images, dst, progress=False)
    assert packer.open_dataset(dst).reader.readahead == "whole"  # 24 MB: far below the bound
    assert packer.open_dataset(dst, readahead=False).reader.readahead == "exact"
    videos = tmp_path / "videos"
    make_video_tree(videos, classes=1, per_class=2)
    packed = tmp_path / f"videos{suffix}"
    packer.convert(videos, packed, progress=False)
    clips = packer.open_dataset(packed, num_frames=4, output="bytes")
    assert clips.reader.readahead == "kernel"  # and its per-video files are read exactly


@pytest.mark.parametrize("suffix", [".npy", ".h5"])
def test_a_cold_shuffled_epoch_reads_the_dataset_once(
    images: Path, tmp_path: Path, suffix: str
) -> None:
    if not os.path.exists("/proc/self/io") or not disk_reads_are_counted(tmp_path):
        pytest.skip("this file system does not count block reads in /proc/self/io (tmpfs?)")
    dst = images.parent / f"images{suffix}"
    if not dst.exists():
        packer.convert(images, dst, progress=False)
    files = data_files(dst)
    data = sum(f.stat().st_size for f in files)
    assert data > 16 << 20  # two readahead windows: a fault alone could not read it all
    dataset = packer.open_dataset(dst, output="bytes")
    dataset[0]  # the tables are read; the data starts cold below
    dataset.reader.close()
    evict_page_cache(files)
    order = np.random.default_rng(0).permutation(len(dataset))
    before = read_bytes()
    first, _ = dataset[int(order[0])]
    at_first_touch = read_bytes() - before
    got = [first] + [dataset[int(i)][0] for i in order[1:]]
    epoch = read_bytes() - before
    assert sum(len(b) for b in got) > 0.9 * data
    assert at_first_touch >= 0.9 * data, (at_first_touch, data)  # the whole shard, at once
    assert epoch <= 1.1 * data, (epoch, data)
