#!/usr/bin/env python
"""ImageNet-sized indexes: scan, convert and open a tree of a million tiny JPEGs, then read one
epoch of raw bytes with DataLoader workers and watch their memory.

The tree (``--classes`` × ``--per-class`` distinct paths, default 1000 × 1000) is hard links to
a handful of 8×8 JPEGs, so it costs seconds and megabytes while the scan and the conversion see
a million files. Measured:

- scan: ``packer.scan`` of the tree (files/s);
- convert: ``packer convert --check fast`` in a child process (files/s, its peak RSS from
  ``getrusage(RUSAGE_CHILDREN)``);
- open: ``packer.open_dataset`` (median of 3, after a first open for the imports), the bytes
  it allocates per sample (tracemalloc), and the index bytes per sample (``index.npy`` +
  ``records.npy`` + ``keys.txt``);
- epoch: one epoch of raw bytes through ``DataLoader(num_workers=--workers)``; each worker's
  private memory (``/proc/<pid>/smaps_rollup``) at its first and last batch. Private *dirty*
  pages growing would be copy-on-read; private *clean* pages are shard pages only that worker
  has read (file pages, dropped under memory pressure). Without ``--gc-freeze`` the dirty
  pages grow by ~40 MB per worker early in the epoch and then stay flat whatever the dataset's
  size: the garbage collector of each worker writing the headers of the objects it inherited
  from the parent (torch, modules), not packer's per-sample state (there is none);
  ``gc.freeze()`` before the workers fork keeps them flat from the start.

Usage::

    flock /tmp/packer-bench.lock python benchmarks/scale.py --data /tmp/packer-scale
"""

from __future__ import annotations

import argparse
import gc
import resource
import shutil
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from harness.record import report_head, save_report
from harness.scale import MemoryProbe, index_bytes, make_linked_tree, private_bytes
from harness.throughput_report import machine_info
from torch.utils.data import DataLoader

import packer
from packer.bench.bench_report import markdown_table
from packer.source.images import scan

MB = 1e6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data/scale"))
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--per-class", type=int, default=1000)
    p.add_argument("--format", default="lmdb", choices=("lmdb", "npy", "h5"))
    p.add_argument("--convert-workers", type=int, default=None)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers of the epoch")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() in the parent before the epoch's workers fork (see the docstring)",
    )
    p.add_argument("--keep", action="store_true", help="keep the tree and the output")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/scale.json"))
    return p.parse_args(argv)


def convert(tree: Path, dst: Path, workers: int | None) -> dict[str, float]:
    """Run ``packer convert --check fast`` in a child; its time and peak RSS."""
    command = [sys.executable, "-m", "packer", "convert", str(tree), str(dst), "--check", "fast"]
    command += ["--overwrite"] + (["--workers", str(workers)] if workers else [])
    begun = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - begun
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"seconds": seconds, "peak_rss_mb": peak_kib * 1024 / MB}


def open_figures(dst: Path) -> dict[str, float]:
    """Time and allocations of ``open_dataset``, and the index bytes per sample."""
    n = len(packer.open_dataset(dst))  # imports and first-time work out of the measurement
    times = []
    for _ in range(3):
        begun = time.perf_counter()
        packer.open_dataset(dst)
        times.append(time.perf_counter() - begun)
    tracemalloc.start()
    packer.open_dataset(dst)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "seconds": statistics.median(times),
        "allocated_per_sample": peak / n,
        "index_bytes_per_sample": index_bytes(dst) / n,
    }


def keep(batch: Any) -> Any:
    return batch


def epoch(dst: Path, workers: int, batch_size: int, gc_freeze: bool = False) -> dict[str, Any]:
    """One epoch of raw bytes; each worker's private memory at its first and last batch."""
    dataset = packer.open_dataset(dst, output="bytes")
    if gc_freeze:
        gc.freeze()
    loader = DataLoader(
        MemoryProbe(dataset), batch_size=batch_size, num_workers=workers, collate_fn=keep
    )
    seen: dict[int, dict[str, Any]] = {}
    begun, samples = time.perf_counter(), 0
    try:
        for pid, count, start, now in loader:
            samples += count
            seen[pid] = {"start": start, "end": now}
    finally:
        if gc_freeze:
            gc.unfreeze()
    seconds = time.perf_counter() - begun
    per_worker = []
    for pid, m in sorted(seen.items()):
        if m["start"] is None or m["end"] is None:
            continue
        (clean0, dirty0), (clean1, dirty1) = m["start"], m["end"]
        per_worker.append(
            {
                "pid": pid,
                "uss_start_mb": (clean0 + dirty0) / MB,
                "uss_end_mb": (clean1 + dirty1) / MB,
                "dirty_start_mb": dirty0 / MB,
                "dirty_end_mb": dirty1 / MB,
            }
        )
    parent = private_bytes()
    return {
        "samples": samples,
        "seconds": seconds,
        "workers": per_worker,
        "parent_uss_mb": sum(parent) / MB if parent else None,
    }


def report(figures: dict[str, Any]) -> str:
    """The markdown table."""
    n = figures["samples"]
    scanned, conv, opened = figures["scan"], figures["convert"], figures["open"]
    rows = [
        ("scan", f"{scanned['seconds']:.1f} s", f"{n / scanned['seconds']:,.0f} files/s"),
        (
            "convert --check fast",
            f"{conv['seconds']:.0f} s",
            f"{n / conv['seconds']:,.0f} files/s, peak RSS {conv['peak_rss_mb']:,.0f} MB "
            f"({conv['peak_rss_mb'] * MB / n:.0f} B/sample)",
        ),
        (
            "open_dataset",
            f"{opened['seconds'] * 1000:.0f} ms",
            f"{opened['allocated_per_sample']:.1f} B/sample allocated, index "
            f"{opened['index_bytes_per_sample']:.1f} B/sample on disk",
        ),
    ]
    ep = figures["epoch"]
    rows.append(("epoch of raw bytes", f"{ep['seconds']:.0f} s", f"{n / ep['seconds']:,.0f} img/s"))
    for w in ep["workers"]:
        rows.append(
            (
                f"worker {w['pid']} USS",
                f"{w['uss_start_mb']:.0f} → {w['uss_end_mb']:.0f} MB",
                f"private dirty {w['dirty_start_mb']:.1f} → {w['dirty_end_mb']:.1f} MB",
            )
        )
    table = markdown_table(["step", "time", "figures"], "lll", rows)
    return f"\n{n:,} samples ({figures['format']})\n\n{table}"


def main(args: argparse.Namespace) -> int:
    """Generate, measure, print a markdown table, write the JSON; delete the data unless --keep."""
    tree, dst = args.data / "tree", args.data / f"out.{args.format}"
    try:
        begun = time.perf_counter()
        n = make_linked_tree(tree, args.classes, args.per_class)
        print(f"tree of {n} files in {time.perf_counter() - begun:.0f} s", file=sys.stderr)
        begun = time.perf_counter()
        found = len(scan(tree).samples)
        scanned = {"seconds": time.perf_counter() - begun, "files": found}
        print(f"scan: {scanned['seconds']:.1f} s", file=sys.stderr)
        converted = convert(tree, dst, args.convert_workers)
        print(f"convert: {converted['seconds']:.0f} s", file=sys.stderr)
        figures = {
            "samples": n,
            "format": args.format,
            "scan": scanned,
            "convert": converted,
            "open": open_figures(dst),
            "epoch": epoch(dst, args.workers, args.batch_size, args.gc_freeze),
        }
    finally:
        if not args.keep:
            shutil.rmtree(tree, ignore_errors=True)
            shutil.rmtree(dst, ignore_errors=True)
    print(report(figures))
    save_report(args.out, {**report_head("scale", machine_info(), args), **figures}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
