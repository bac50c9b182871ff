"""Attacks on a packed dataset's containment and snapshot guarantees (issue 18): crafted record
bounds, tables flipped bit by bit, FIFOs where files belong, symlinks at every level of the
dataset, split names that leave it, and a dataset converted again while it is open. Every attack
ends in one clear outcome: a FormatError naming what is wrong, or a finding of ``verify``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.errors import FormatError
from packer.manifest import MANIFEST_NAME, file_checksum, load_index, load_manifest, load_records


def copy(packed: dict[str, Path], suffix: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed[suffix], tmp_path / f"x{suffix}"))


def seal(root: Path) -> None:
    """Record the tables' current checksums in the manifest, as a crafted output would."""
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["files"] = {name: file_checksum(root / name) for name in data["files"]}
    (root / MANIFEST_NAME).write_text(json.dumps(data))


def craft_record(root: Path, row: int, offset: int) -> None:
    records = load_records(root, load_index(root, load_manifest(root)))
    records = np.array(records)
    records["offset"][row] = offset
    np.save(root / "records.npy", records)
    seal(root)


@pytest.mark.parametrize("suffix", [".h5", ".lmdb", ".npy"])
def test_an_offset_near_2_63_cannot_wrap_past_the_bounds(
    packed: dict[str, Path], tmp_path: Path, suffix: str
) -> None:
    root = copy(packed, suffix, tmp_path)
    craft_record(root, 5, 2**63 - 10)
    with pytest.raises(FormatError, match="record lies outside its file .row 5"):
        packer.open_dataset(root, output="bytes")


@pytest.mark.parametrize("suffix", [".h5", ".lmdb", ".npy"])
@pytest.mark.parametrize("over", [1, 3])
def test_a_record_overrunning_its_shard_by_a_few_bytes(
    packed: dict[str, Path], tmp_path: Path, suffix: str, over: int
) -> None:
    root = copy(packed, suffix, tmp_path)
    manifest = load_manifest(root)
    records = load_records(root, load_index(root, manifest))
    row = len(records) - 1
    size = manifest.shards[int(records["file"][row])].bytes
    craft_record(root, row, size - int(records["length"][row]) + over)
    with pytest.raises(FormatError, match=f"record lies outside its file .row {row}"):
        packer.open_dataset(root, output="bytes")
    craft_record(root, row, size - int(records["length"][row]))  # ends at the last byte: fine
    packer.open_dataset(root, output="bytes")
