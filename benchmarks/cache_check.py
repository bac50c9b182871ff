#!/usr/bin/env python
"""What checking records read from the node-local shard cache costs (issue 28, item 5): records/s
of warm cached LMDB and NPY reads with the record check (xxh3 of every record against the record
table, as ranged reads are checked) and without it, side by side in one run.

Makes a tree of ``--images`` photo-like JPEGs (``--size``), converts it to LMDB and NPY, puts
both on a local S3 API server (moto, the tests' ``s3_server``), warms a cache with every shard,
then times ``read_many`` of shuffled batches of ``--batch`` records over the whole dataset, one
process, warm page cache: check on, check off (the reader's CacheCheck replaced by a no-op),
alternated, median of ``--repeats`` epochs each. Prints one JSON object and writes it to
``--out`` (default ``benchmarks/results/cache_check.json``).

Usage::

    python benchmarks/cache_check.py --images 2000 --size 320x240 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from packer.formats.record_check import RecordCheck

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the tests' real S3 server (moto)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", default="320x240", help="WxH of the JPEGs")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "cache_check.json")
    return parser.parse_args(argv)


class Unchecked(RecordCheck):
    """The record check of a cached read replaced by none (``check off``)."""

    def many(self, rec: np.ndarray, out: list[Any]) -> list[int]:  # noqa: ARG002
        return []

    def into(self, rec: np.ndarray, buffer: Any, dest: np.ndarray) -> None:  # noqa: ARG002
        return None


def _epoch(reader: Any, batches: list[np.ndarray]) -> float:
    began = time.perf_counter()
    for batch in batches:
        reader.read_many(batch)
    return time.perf_counter() - began


def main(args: argparse.Namespace) -> dict[str, Any]:
    from s3_server import s3_server

    import packer
    from packer.demo.image import make_image_tree
    from packer.remote.cache import wait_for_downloads

    width, height = (int(v) for v in args.size.split("x"))
    work = Path(tempfile.mkdtemp(prefix="packer-cache-check-"))
    results = []
    try:
        per_class = max(1, args.images // 4)
        tree = make_image_tree(
            work / "images", classes=4, per_class=per_class, size=(width, height)
        )
        with s3_server("bench") as server:
            for suffix in (".lmdb", ".npy"):
                local = work / f"images{suffix}"
                packer.convert(tree.root, local, shard_size="16MB", workers=2, progress=False)
                url = server.upload(local, local.name)
                options = {"storage_options": server.options, "cache_dir": work / "cache"}
                dataset = packer.open_dataset(url, output="bytes", **options)
                reader = dataset.reader
                reader.prefetch(range(len(reader.shard_names)))
                assert wait_for_downloads(600)
                n = len(reader.length)
                order = np.random.default_rng(0).permutation(n)
                batches = [order[i : i + args.batch] for i in range(0, n, args.batch)]
                _epoch(reader, batches)  # warm: every shard open and in the page cache
                unchecked = Unchecked(reader.record_digests, reader.length)
                times: dict[str, list[float]] = {"on": [], "off": []}
                for _ in range(args.repeats):
                    vars(reader).pop("_cache_check", None)  # the reader's own: CacheCheck
                    times["on"].append(_epoch(reader, batches))
                    reader._cache_check = lambda none=unchecked: none
                    times["off"].append(_epoch(reader, batches))
                vars(reader).pop("_cache_check", None)
                on, off = (statistics.median(times[k]) for k in ("on", "off"))
                mean_bytes = float(reader.length.mean())
                results.append(
                    {
                        "format": suffix[1:],
                        "records": n,
                        "mean_record_bytes": round(mean_bytes),
                        "records_per_s_checked": round(n / on),
                        "records_per_s_unchecked": round(n / off),
                        "checked_over_unchecked": round(off / on, 3),
                        "check_us_per_record": round((on - off) / n * 1e6, 2),
                        "epochs_s": {k: [round(t, 4) for t in v] for k, v in times.items()},
                    }
                )
                dataset.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "benchmark": "cache_check",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "machine": {"python": platform.python_version(), "cpu": platform.processor()},
        "options": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main(parse_args())
