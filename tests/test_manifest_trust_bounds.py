"""Issue 40 item 11: a manifest is bounded before it is parsed (64 MiB) and before its shards are
built (200,000), far above what an ImageNet-scale conversion writes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import packer
from packer.core.manifest import MANIFEST_NAME, load_manifest, parse_manifest
from packer.core.manifest_schema import MAX_MANIFEST_BYTES, MAX_MANIFEST_SHARDS, trusted_digest
from packer.errors import FormatError


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_a_500_mb_manifest_is_refused_before_it_is_read(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(packed[".npy"], tmp_path / "x.npy")
    path = root / MANIFEST_NAME
    os.truncate(path, 500 << 20)  # sparse: 500 MB of zeros after the real manifest
    with pytest.raises(FormatError, match=f"524,288,000 bytes, over the {MAX_MANIFEST_BYTES:,}"):
        packer.open_dataset(root)
    with pytest.raises(FormatError, match="over the"):
        parse_manifest(b" " * (MAX_MANIFEST_BYTES + 1), "s3://b/x/packer.json", "s3://b/x")


def test_a_manifest_listing_2_000_000_shards_is_refused(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(packed[".lmdb"], tmp_path / "x.lmdb")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["shards"] = [0] * 2_000_000  # compact: under the byte cap, so the count cap decides
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(FormatError, match="a list of 2,000,000'; expected at most 200,000"):
        packer.open_dataset(root)


def test_an_imagenet_scale_manifest_stays_far_under_the_caps(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(packed[".lmdb"], tmp_path / "x.lmdb")
    data = json.loads((root / MANIFEST_NAME).read_text())
    shard = data["shards"][0]
    data["shards"] = [dict(shard, name=f"shard-{i:05d}.mdb") for i in range(1_000)]
    data["classes"] = [f"n{i:08d}" for i in range(1_000)]
    data["skipped"] = [
        {"path": f"train/n{i % 1000:08d}/n{i:08d}_{i}.JPEG", "reason": "cannot decode: truncated"}
        for i in range(20_000)
    ]
    data["trusted_xxh3_64"] = trusted_digest(data)  # its classes changed: signed again
    raw = json.dumps(data, indent=1).encode()
    assert len(raw) * 10 < MAX_MANIFEST_BYTES and 1_000 * 100 < MAX_MANIFEST_SHARDS
    (root / MANIFEST_NAME).write_bytes(raw)
    assert len(load_manifest(root).shards) == 1_000
