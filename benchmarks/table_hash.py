#!/usr/bin/env python
"""What checking the tables at open costs: xxh3 of ``index.npy``, ``records.npy`` and
``keys.txt`` for a dataset of ``--samples`` images (default one million), warm page cache.

Writes the three tables of a synthetic dataset with packer's own writers (one record per
sample, keys like ``c0123/img_0001234``), then times, median of ``--repeats`` runs after one
warm-up: ``read_checked`` (open beneath the folder, map, hash: what ``open_dataset`` does per
table) and the whole ``packer.core.tablefile`` load of each table. Prints one JSON object.

Usage::

    python benchmarks/table_hash.py --samples 1000000 --data /tmp/packer-table-hash
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from packer.core.manifest import (
    INDEX_NAME,
    KEYS_NAME,
    RECORD_DTYPE,
    RECORDS_NAME,
    SAMPLE_DTYPE,
    write_index,
    write_keys,
    write_records,
)
from packer.core.tablefile import read_checked


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, default=Path("/tmp/packer-table-hash"))
    return parser.parse_args(argv)


def write_tables(root: Path, n: int) -> dict[str, str]:
    """The three tables of an ``n``-sample image dataset; their checksums."""
    index = np.zeros(n, SAMPLE_DTYPE)
    index["label"] = np.arange(n) % 1000
    index["count"] = 1
    index["first"] = np.arange(n)
    records = np.zeros(n, RECORD_DTYPE)
    records["length"] = 110_000
    records["offset"] = np.arange(n, dtype=np.int64) * 110_000 % (1 << 30)
    records["checksum"] = np.arange(n, dtype=np.uint64) * 0x9E3779B97F4A7C15
    keys = (f"c{i % 1000:04d}/img_{i:07d}" for i in range(n))
    return {
        INDEX_NAME: write_index(root, index),
        RECORDS_NAME: write_records(root, records),
        KEYS_NAME: write_keys(root, keys),
    }


def median_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(repeats):
        begun = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begun)
    return statistics.median(times) * 1000


def main(args: argparse.Namespace) -> dict[str, object]:
    shutil.rmtree(args.data, ignore_errors=True)
    args.data.mkdir(parents=True)
    digests = write_tables(args.data, args.samples)
    result: dict[str, object] = {"samples": args.samples, "tables": {}}
    for name, digest in digests.items():
        size = (args.data / name).stat().st_size
        ms = median_ms(lambda n=name, d=digest: read_checked(args.data, n, d, True), args.repeats)
        unchecked = median_ms(lambda n=name: read_checked(args.data, n, None, True), args.repeats)
        result["tables"][name] = {  # type: ignore[index]
            "bytes": size,
            "open_map_hash_ms": round(ms, 2),
            "open_map_only_ms": round(unchecked, 2),
        }
    total = sum(t["open_map_hash_ms"] - t["open_map_only_ms"] for t in result["tables"].values())  # type: ignore[attr-defined]
    result["hash_ms_per_million_samples"] = round(total * 1e6 / args.samples, 1)
    result["machine"] = f"{platform.platform()}, {platform.processor() or platform.machine()}"
    result["command"] = f"python benchmarks/table_hash.py --samples {args.samples}"
    print(json.dumps(result, indent=1))
    shutil.rmtree(args.data, ignore_errors=True)
    return result


if __name__ == "__main__":
    main(parse_args())
