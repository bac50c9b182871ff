#!/usr/bin/env python
"""Conversion throughput (MB/s, files/s) of ``packer convert`` against ``tar cf`` of the same
tree, locally and with ``--dask local:N``, with ``--check fast`` and the default check.

The tree is made once in ``--data`` (photo-like 400×350 JPEGs, ~87 KB each, 10 classes). Every
run reads a warm page cache (the tree was just written, then tarred) and writes a fresh output on
the same file system, fsyncs included; one run each, so read the ratios, not the third digit.
The Dask cluster is started before its runs are timed (its start-up is reported apart). With
``--profile``, a local conversion with ``--check fast`` and one loader (so that cProfile sees the
loading too) is profiled first and its top functions printed.

Usage::

    flock /tmp/packer-bench.lock python benchmarks/scale_convert.py --images 5000 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.throughput_report import machine_info

import packer
from packer.cluster import dask_client
from packer.tools.image_demo import make_image_tree


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data/scale"))
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--format", default="lmdb", choices=("lmdb", "npy", "hdf5", "bmp"))
    p.add_argument("--shard-size", default="64MB")
    p.add_argument("--workers", type=int, default=None, help="local loaders (default: CPUs)")
    p.add_argument("--dask-workers", type=int, default=2, help="0: no Dask runs")
    p.add_argument("--checks", nargs="+", default=["fast", "scan"])
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/scale_convert.json"))
    return p.parse_args(argv)


def prepare(data: Path, images: int) -> Path:
    """The tree of ``images`` generated JPEGs (made once, then reused)."""
    src = data / f"n{images}" / "images"
    if not src.is_dir() or sum(1 for _ in src.rglob("*.JPEG")) != images:
        print(f"generating {images} JPEGs in {src} ...", file=sys.stderr)
        make_image_tree(src, classes=10, per_class=images // 10, bad=0)
    return src


def tree_bytes(src: Path) -> tuple[int, int]:
    files = [f for f in src.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def time_tar(src: Path, out: Path) -> float:
    """Seconds for ``tar cf`` of the tree, plus an fsync of the archive (as packer fsyncs)."""
    tar = out / "images.tar"
    start = time.perf_counter()
    subprocess.run(["tar", "cf", str(tar), "-C", str(src.parent), src.name], check=True)
    subprocess.run(["sync", str(tar)], check=True)
    seconds = time.perf_counter() - start
    tar.unlink()
    return seconds


def time_convert(src: Path, dst: Path, args: argparse.Namespace, **options: Any) -> float:
    start = time.perf_counter()
    packer.convert(src, dst, shard_size=args.shard_size, overwrite=True, progress=False, **options)
    seconds = time.perf_counter() - start
    shutil.rmtree(dst)
    return seconds


def profile(src: Path, dst: Path, args: argparse.Namespace) -> str:
    """The top functions (cumulative and own time) of a one-loader local --check fast run."""
    profiler = cProfile.Profile()
    profiler.enable()
    packer.convert(
        src, dst, shard_size=args.shard_size, overwrite=True, progress=False, check="fast",
        workers=1,
    )  # fmt: skip
    profiler.disable()
    shutil.rmtree(dst)
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)
    return text.getvalue()


def main(args: argparse.Namespace) -> int:
    src = prepare(args.data, args.images)
    out = args.data / "out"
    out.mkdir(parents=True, exist_ok=True)
    dst = out / f"images.{args.format}"
    files, size = tree_bytes(src)
    if args.profile:
        print(profile(src, dst, args))
    rows: list[dict[str, Any]] = [{"run": "tar cf", "seconds": time_tar(src, out)}]
    for check in args.checks:
        seconds = time_convert(src, dst, args, check=check, workers=args.workers)
        rows.append({"run": f"packer local, --check {check}", "seconds": seconds})
    startup = None
    if args.dask_workers:
        begun = time.perf_counter()
        with dask_client(f"local:{args.dask_workers}") as client:
            startup = time.perf_counter() - begun
            for check in args.checks:
                seconds = time_convert(src, dst, args, check=check, executor=client)
                rows.append(
                    {"run": f"packer --dask local:{args.dask_workers}, --check {check}",
                     "seconds": seconds}
                )  # fmt: skip
    tar_seconds = rows[0]["seconds"]
    print(f"\n{files} files, {size / 1e6:.1f} MB, {args.format}, shards of {args.shard_size}")
    if startup is not None:
        print(f"dask LocalCluster start-up (not in the times below): {startup:.1f} s")
    print("\n| run | seconds | MB/s | files/s | × tar |\n|---|---:|---:|---:|---:|")
    for row in rows:
        row |= {
            "mb_per_s": size / 1e6 / row["seconds"],
            "files_per_s": files / row["seconds"],
            "vs_tar": tar_seconds / row["seconds"],
        }
        print(
            f"| {row['run']} | {row['seconds']:.2f} | {row['mb_per_s']:.0f} | "
            f"{row['files_per_s']:,.0f} | {row['vs_tar']:.2f} |"
        )
    report = {
        "command": " ".join(sys.argv),
        "machine": machine_info(),
        "files": files,
        "bytes": size,
        "format": args.format,
        "shard_size": args.shard_size,
        "dask_startup_s": startup,
        "results": rows,
    }
    path = args.out if args.out.suffix == ".json" else args.out / "scale_convert.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
