"""A complete packer NPY output of ``n`` one-byte image records, written in well under a
second for a million samples with packer's own table and manifest writers (no image encoded,
no conversion run): what a test of a dataset's size-independent behaviour opens."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xxhash

from packer.core.manifest import (
    INDEX_NAME,
    KEYS_NAME,
    RECORD_DTYPE,
    RECORDS_NAME,
    SAMPLE_DTYPE,
    Manifest,
    ShardInfo,
    file_checksum,
    write_index,
    write_manifest,
    write_records,
)


def _write_keys(path: Path, n: int) -> str:
    """Keys ``0000000`` ... (one a line, the form ``packer.core.manifest.write_keys`` writes),
    made by numpy: no ``str`` per key."""
    keys = np.char.add(np.char.zfill(np.arange(n).astype("S7"), 7), b"\n")
    path.write_bytes(keys.tobytes())
    return file_checksum(path)


def write_tiny(root: Path, n: int, classes: int = 10) -> Path:
    """``root`` (an ``.npy`` folder) holding ``n`` samples of one byte each, keys ``%07d``
    (not decodable: read them with ``output="bytes"``), labels cycling over ``classes``, in one
    shard."""
    root.mkdir(parents=True)
    shard = root / "shard-00000.npy"
    data = (np.arange(n) % 251).astype(np.uint8)
    shard.write_bytes(data.tobytes())
    index = np.zeros(n, dtype=SAMPLE_DTYPE)
    index["label"] = np.arange(n) % classes
    index["count"] = 1
    index["first"] = np.arange(n)
    records = np.zeros(n, dtype=RECORD_DTYPE)
    records["length"] = 1
    records["offset"] = np.arange(n)
    digests = np.array([xxhash.xxh3_64_intdigest(bytes([v])) for v in range(251)], np.uint64)
    records["checksum"] = digests[data]  # each record's xxh3, as a conversion records it
    files = {
        INDEX_NAME: write_index(root, index),
        RECORDS_NAME: write_records(root, records),
        KEYS_NAME: _write_keys(root / KEYS_NAME, n),
    }
    manifest = Manifest(
        format="npy",
        kind="image",
        num_samples=n,
        classes=[f"c{i}" for i in range(classes)],
        shards=[ShardInfo(shard.name, n, n, file_checksum(shard))],
        options={"layout": "shards"},
        files=files,
    )
    write_manifest(root, manifest)
    return root
