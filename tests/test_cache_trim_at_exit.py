"""The shard cache keeps its limit once its readers are gone (issue 40 item 11): while objects
are in use the cache may pass ``cache_limit`` by them (a held shard is never evicted), but a
process that read through it leaves it trimmed back to the limit when it exits — a DataLoader
worker (fork and spawn) and a plain process that never closed its dataset alike.

Real LMDB datasets staged through the cache from the local disk, real worker processes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import packer
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("trim_src")
    images = make_image_tree(root / "images", classes=3, per_class=6, size=(64, 48), bad=0)
    out = root / "images.lmdb"
    packer.convert(images.root, out, shard_size="6kB", workers=1, progress=False)
    assert len(load_manifest(out).shards) >= 6
    return out


def _kept(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.glob("*.data"))


def _limit(source: Path) -> int:
    return 2 * max(s.bytes for s in load_manifest(source).shards)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_leave_the_cache_within_its_limit(
    source: Path, tmp_path: Path, context: str
) -> None:
    cache, limit = tmp_path / "shm", _limit(source)
    dataset = packer.open_dataset(source, cache_dir=cache, cache_limit=limit, output="tensor")
    loader = DataLoader(
        dataset, batch_size=1, num_workers=2, multiprocessing_context=context, timeout=60
    )
    assert len(list(loader)) == len(dataset)  # the workers exit at the epoch's end
    dataset.close()
    assert 0 < _kept(cache) <= limit < sum(s.bytes for s in load_manifest(source).shards)


def test_a_process_that_never_closes_leaves_the_cache_within_its_limit(
    source: Path, tmp_path: Path
) -> None:
    cache, limit = tmp_path / "shm", _limit(source)
    script = (
        "import sys, packer\n"
        "ds = packer.open_dataset(sys.argv[1], cache_dir=sys.argv[2], cache_limit=int(sys.argv[3]))\n"
        "held = [ds[i] for i in range(len(ds))]\n"  # no close: the exit must trim
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(source), str(cache), str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert 0 < _kept(cache) <= limit, (_kept(cache), limit)
