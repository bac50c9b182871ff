"""Checkpoints are compact and durable: rows held as machine integers, saved as ``.npy`` tables
and keys with a JSON written last; older (JSON-row) checkpoints still resume; a changed table is
never trusted; and a conversion's Python memory per sample stays small."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness.scale import make_linked_tree

import packer
from packer.core.manifest import ShardInfo
from packer.demo.image import DemoTree
from packer.errors import PackerError
from packer.write.resume import PROGRESS_DIR, Progress, Rows

SHARD = "15kB"


class Stop(Exception):
    """Raised by the progress hook to interrupt a conversion (its partial output stays)."""


def interrupted(src: Path, dst: Path, shard: int) -> Progress:
    """Convert ``src`` into ``dst`` until planned shard ``shard`` is checkpointed."""

    def on_event(name: str, number: int) -> None:
        if (name, number) == ("shard", shard):
            raise Stop

    with pytest.raises(Stop):
        packer.convert(src, dst, shard_size=SHARD, workers=1, progress=False, on_event=on_event)
    return Progress(dst.with_name(dst.name + ".partial"))


def test_rows_checkpoint_round_trip(tmp_path: Path) -> None:
    rows = Rows()
    rows.add(3, "a/caf\udce9", [10], [0], [2**64 - 1])
    rows.add(1, "b/two\nlines\\x\r", [5, 6, 7], [10, 15, 21], [1, 2, 3])
    rows.skipped.append({"path": "/src/bad.jpg", "reason": "truncated"})
    checkpoint = rows.checkpoint(ShardInfo("shard-00004.mdb", 4, 123, "ab"), 4, np.arange(4) * 7)
    assert checkpoint.samples.tolist() == [(3, 1), (1, 3)]
    assert checkpoint.records.tolist() == [
        (4, 10, 0, 2**64 - 1),
        (4, 5, 7, 1),
        (4, 6, 14, 2),
        (4, 7, 21, 3),
    ]
    progress = Progress(tmp_path)
    progress.start({})
    progress.save(4, checkpoint)
    loaded = progress.load(4)
    assert loaded is not None and loaded.shard == checkpoint.shard
    assert loaded.keys == checkpoint.keys and loaded.skipped == checkpoint.skipped
    assert np.array_equal(loaded.samples, checkpoint.samples)
    assert np.array_equal(loaded.records, checkpoint.records)
    assert progress.load(3) is None
    with pytest.raises(PackerError, match="3 offsets for 4 records"):
        rows.checkpoint(None, 4, np.arange(3))


def test_version_1_checkpoints_still_resume(
    tree_files: Callable[[Path], dict[str, bytes]], tree: DemoTree, tmp_path: Path
) -> None:
    reference = tmp_path / "ref.lmdb"
    packer.convert(tree.root, reference, shard_size=SHARD, workers=1, progress=False)
    dst = tmp_path / "out.lmdb"
    progress = interrupted(tree.root, dst, 1)
    for k in (0, 1):  # rewrite them as packer <= 0.2 wrote them: the rows as JSON lists
        checkpoint = progress.load(k)
        assert checkpoint is not None and checkpoint.shard is not None
        old = {
            "shard": vars(checkpoint.shard),
            "samples": [list(r) for r in checkpoint.samples.tolist()],
            "records": [list(r) for r in checkpoint.records.tolist()],
            "keys": checkpoint.keys,
            "skipped": checkpoint.skipped,
        }
        for path in progress.dir.glob(f"shard-{k:05d}.*"):
            path.unlink()
        (progress.dir / f"shard-{k:05d}.json").write_text(json.dumps(old))
    assert len(progress.resume(json.loads((progress.dir / "fingerprint.json").read_text()))) == 2
    packer.convert(tree.root, dst, shard_size=SHARD, workers=1, progress=False, resume=True)
    assert tree_files(dst) == tree_files(reference)


def test_a_changed_checkpoint_table_is_written_again(
    tree_files: Callable[[Path], dict[str, bytes]], tree: DemoTree, tmp_path: Path
) -> None:
    reference = tmp_path / "ref.npy"
    packer.convert(tree.root, reference, shard_size=SHARD, workers=1, progress=False)
    dst = tmp_path / "out.npy"
    progress = interrupted(tree.root, dst, 1)
    keys = progress.dir / "shard-00001.keys.txt"
    keys.write_bytes(keys.read_bytes().replace(b"class", b"klass", 1))
    assert progress.load(0) is not None and progress.load(1) is None
    packer.convert(tree.root, dst, shard_size=SHARD, workers=1, progress=False, resume=True)
    assert tree_files(dst) == tree_files(reference)
    assert not (dst / PROGRESS_DIR).exists()


def _peak_bytes(src: Path, dst: Path, **options: Any) -> int:
    """The peak of Python allocations during one conversion, above where it started."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        packer.convert(src, dst, check="fast", workers=1, progress=False, **options)
        return tracemalloc.get_traced_memory()[1] - start
    finally:
        tracemalloc.stop()


# Measured: 419 bytes per sample in one shard, 383 in 2 MB shards (the scan's Sample with its key,
# path and size ~265, the rows ~60, the checkpoint's tables 32, the planned sizes ~20); with the
# rows as lists and JSON checkpoints it was 1027 and 545. Now ~325 and ~280.
BYTES_PER_SAMPLE = 500


def test_convert_python_memory_per_sample(tmp_path: Path) -> None:
    """The peak of a conversion's Python allocations grows by at most ``BYTES_PER_SAMPLE`` per
    sample, in one shard (the checkpoint of a whole shard held at once) or in many."""
    small, large = tmp_path / "small", tmp_path / "large"
    make_linked_tree(small, 2, 1000)  # 6,000 samples apart: the constant part cancels out, and
    make_linked_tree(large, 8, 1000)  # measured 280-325 B per sample, as with 12,000
    packer.convert(small, tmp_path / "warm.lmdb", check="fast", workers=1, progress=False)
    for shard_size in ("1GB", "2MB"):
        options = {"shard_size": shard_size, "overwrite": True}
        grown = _peak_bytes(large, tmp_path / "large.lmdb", **options)
        grown -= _peak_bytes(small, tmp_path / "small.lmdb", **options)
        per_sample = grown / 6_000
        assert 0 < per_sample < BYTES_PER_SAMPLE, (shard_size, per_sample)
