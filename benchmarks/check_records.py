#!/usr/bin/env python
"""What ``check_records=True`` costs a local dataset: reads/s with and without the record check,
side by side in one run, for LMDB and NPY.

A photo-like JPEG tree (``packer.demo.image``, ``--images`` of each ``--sizes``) is converted to
``.lmdb`` and ``.npy``; each output is read warm (the page cache filled by a first pass) in
shuffled batches of ``--batch`` through the public API (``open_dataset(..., output="bytes")``,
``__getitems__``), with the check off and on, alternating, ``--rounds`` times (the median kept).
Two read paths: ``bytes`` (a ``bytes`` object per sample: the cheapest read, where the check's
share is the largest) and ``buffer`` (``batch_buffer=True``: the batch read into one buffer).
Per row: reads/s without and with the check, their ratio, and the cost per record in µs
(``1/checked - 1/plain``); beside it the xxh3 alone over the same records in memory
(``xxh3_us_per_record``, ``xxh3_gb_s``: what the check adds at the least). With
``--decode``, the same with ``output="numpy"`` (a JPEG decoded per sample) at the first size:
the check's share of a training read. Prints and writes one JSON object.

Usage::

    python benchmarks/check_records.py --images 2000 --sizes 160x120 500x375 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

import packer
from packer.demo.image import make_image_tree

HERE = Path(__file__).resolve().parent


def _pass(dataset: Any, order: np.ndarray, batch: int) -> float:
    """Seconds to read every sample of ``order`` in batches of ``batch``."""
    began = time.perf_counter()
    for start in range(0, len(order), batch):
        dataset.__getitems__(order[start : start + batch].tolist())
    return time.perf_counter() - began


def _xxh3(dataset: Any) -> tuple[float, float]:
    """The xxh3 alone over every record in memory: µs per record and GB/s (best of 5)."""
    data = [d for d, _ in dataset.__getitems__(list(range(len(dataset))))]
    total = sum(len(d) for d in data)
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for d in data:
            xxhash.xxh3_64_intdigest(d)
        best = min(best, time.perf_counter() - began)
    return best / len(data) * 1e6, total / best / 1e9


def measure(root: Path, mode: str, rounds: int, batch: int, seed: int) -> dict[str, Any]:
    """Reads/s of ``root`` with the check off and on, alternating ``rounds`` times."""
    options: dict[str, Any] = {"output": "numpy" if mode == "decode" else "bytes"}
    if mode == "buffer":
        options["batch_buffer"] = True
    plain = packer.open_dataset(root, **options)
    checked = packer.open_dataset(root, check_records=True, **options)
    order = np.random.default_rng(seed).permutation(len(plain))
    _pass(plain, order, batch)  # warm: the page cache holds the shards
    _pass(checked, order, batch)
    times: dict[str, list[float]] = {"plain": [], "checked": []}
    for _ in range(rounds):
        times["plain"].append(_pass(plain, order, batch))
        times["checked"].append(_pass(checked, order, batch))
    plain_s, checked_s = (statistics.median(times[k]) for k in ("plain", "checked"))
    n = len(order)
    stored = int(plain.stored_bytes(range(n)))
    return {
        "mode": mode,
        "samples": n,
        "mean_record_bytes": stored // n,
        "reads_per_s_plain": round(n / plain_s),
        "reads_per_s_checked": round(n / checked_s),
        "checked_over_plain": round(plain_s / checked_s, 3),
        "cost_us_per_record": round((checked_s - plain_s) / n * 1e6, 2),
        "rounds_s": {k: [round(t, 4) for t in v] for k, v in times.items()},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--sizes", nargs="+", default=["160x120", "500x375"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--decode", action="store_true")
    parser.add_argument("--data", type=Path, default=Path("/tmp/packer-check-records"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "check_records.json")
    args = parser.parse_args(argv)
    commit = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    runs = []
    for size in args.sizes:
        width, height = (int(v) for v in size.split("x"))
        where = args.data / size
        shutil.rmtree(where, ignore_errors=True)
        tree = make_image_tree(
            where / "images", classes=4, per_class=args.images // 4, size=(width, height), bad=0
        )
        for suffix in (".lmdb", ".npy"):
            root = where / f"images{suffix}"
            packer.convert(tree.root, root, workers=2, progress=False)
            us, gb_s = _xxh3(packer.open_dataset(root, output="bytes"))
            modes = ["bytes", "buffer"] + (
                ["decode"] if args.decode and size == args.sizes[0] else []
            )
            for mode in modes:
                row = measure(root, mode, args.rounds, args.batch, seed=0)
                row.update(
                    format=suffix[1:],
                    image_size=size,
                    xxh3_us_per_record=round(us, 2),
                    xxh3_gb_s=round(gb_s, 2),
                )
                print(json.dumps({k: v for k, v in row.items() if k != "rounds_s"}), flush=True)
                runs.append(row)
        shutil.rmtree(where, ignore_errors=True)
    with open("/proc/loadavg") as fh:
        load = fh.read().split()[:3]
    result = {
        "benchmark": "check_records",
        "commit": commit,
        "machine": f"{platform.machine()}, {mp.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_at_end": [float(v) for v in load],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "batch": args.batch,
        "rounds": args.rounds,
        "runs": runs,
    }
    text = json.dumps(result, indent=1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
