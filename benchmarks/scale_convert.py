#!/usr/bin/env python
"""Conversion throughput (MB/s, files/s) of ``packer convert`` against ``tar cf`` of the same
tree, locally and with ``--dask local:N``, with ``--check fast`` and the default check.

The tree is made once in ``--data`` (photo-like 400×350 JPEGs, ~87 KB each, 10 classes). Every
run reads a warm page cache (the tree was just written, then tarred) and writes a fresh output on
the same file system, fsyncs included. ``--repeats N`` interleaves N rounds (tar, then every
format × check) and reports medians, and each run's ratio to the tar of its own round (the
median of those ratios). Each run's CPU seconds (its threads and pool processes) give the
default check's target: wall ≤ 1.2 × CPU seconds ÷ cores. The Dask cluster is started before its
runs are timed (its start-up is reported apart). With ``--stages``, every stage of the pipeline
is measured alone on one thread (``harness/convert_stages.py``): its cost per image, its share,
and what that predicts for ImageNet (1.28 M files) on 8 and 32 cores. With ``--profile``, a
local conversion with ``--check fast`` and one loader (so that cProfile sees the loading too) is
profiled first and its top functions printed.

Usage::

    flock /tmp/packer-bench.lock python benchmarks/scale_convert.py --images 5000 \
        --repeats 3 --formats lmdb npy hdf5 --dask-workers 0 --stages
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from harness.convert_stages import (
    FINISHER,
    PARALLEL,
    RECEIVER,
    WRITER,
    measure_stages,
    project,
    scan_share,
)
from harness.throughput_report import machine_info

import packer
from packer.core.cpus import available_cpus
from packer.demo.image import make_image_tree
from packer.write.dask_client import dask_client


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data/scale"))
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--formats", nargs="+", default=["lmdb"], choices=("lmdb", "npy", "hdf5", "bmp"))
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (medians)")
    p.add_argument("--stages", action="store_true", help="measure each stage alone, project")
    p.add_argument("--shard-size", default="64MB")
    p.add_argument("--workers", type=int, default=None, help="local loaders (default: CPUs)")
    p.add_argument("--dask-workers", type=int, default=2, help="0: no Dask runs")
    p.add_argument("--shard-processes", type=int, default=0,
                   help="also convert with executor=ProcessPoolExecutor(N): N shards at once")  # fmt: skip
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


def time_convert(src: Path, dst: Path, args: argparse.Namespace, **options: Any) -> dict:
    """Wall and CPU seconds (this process's threads and its pool's processes) of a conversion."""
    before, start = os.times(), time.perf_counter()
    packer.convert(src, dst, shard_size=args.shard_size, overwrite=True, progress=False, **options)
    seconds, after = time.perf_counter() - start, os.times()
    shutil.rmtree(dst)
    cpu = sum(getattr(after, f) - getattr(before, f) for f in _CPU_FIELDS)
    return {"seconds": seconds, "cpu_seconds": cpu}


_CPU_FIELDS = ("user", "system", "children_user", "children_system")


def time_with_pool(src: Path, dst: Path, args: argparse.Namespace, check: str) -> dict:
    """:func:`time_convert` with ``executor=`` a pool of ``--shard-processes`` processes (started
    before the clock, as the Dask cluster is; their CPU counted once they have exited)."""
    before = os.times()
    with ProcessPoolExecutor(args.shard_processes) as pool:
        pool.submit(int).result()  # the workers are up
        timed = time_convert(src, dst, args, check=check, executor=pool)
    after = os.times()
    return timed | {"cpu_seconds": sum(getattr(after, f) - getattr(before, f) for f in _CPU_FIELDS)}


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


def rounds(src: Path, out: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--repeats`` interleaved rounds: tar, then every format × check; every run's times."""
    runs: list[dict[str, Any]] = []
    for round_ in range(args.repeats):
        tar = time_tar(src, out)
        runs.append({"run": "tar cf", "round": round_, "seconds": tar, "tar": tar})
        for fmt in args.formats:
            for check in args.checks:
                timed = time_convert(src, out / f"images.{fmt}", args, check=check,
                                     workers=args.workers)  # fmt: skip
                name = f"packer {fmt}, --check {check}"
                runs.append({"run": name, "round": round_, "tar": tar, **timed})
                if args.shard_processes:
                    timed = time_with_pool(src, out / f"images.{fmt}", args, check)
                    name = f"packer {fmt}, --check {check}, {args.shard_processes} shard processes"
                    runs.append({"run": name, "round": round_, "tar": tar, **timed})
    return runs


def dask_runs(src: Path, out: Path, args: argparse.Namespace) -> tuple[list[dict], float]:
    """One run per check with ``--dask local:N`` (LMDB), and the cluster's start-up seconds."""
    runs = []
    begun = time.perf_counter()
    with dask_client(f"local:{args.dask_workers}") as client:
        startup = time.perf_counter() - begun
        for check in args.checks:
            tar = time_tar(src, out)
            timed = time_convert(src, out / "images.lmdb", args, check=check, executor=client)
            name = f"packer lmdb --dask local:{args.dask_workers}, --check {check}"
            runs.append({"run": name, "round": 0, "tar": tar, **timed})
    return runs, startup


def summarize(runs: list[dict[str, Any]], files: int, size: int) -> list[dict[str, Any]]:
    """One row per run name: medians over its rounds, and the median of its ratios to tar."""
    rows = []
    cores = available_cpus()
    for name in dict.fromkeys(r["run"] for r in runs):
        mine = [r for r in runs if r["run"] == name]
        seconds = statistics.median(r["seconds"] for r in mine)
        row = {
            "run": name,
            "rounds": len(mine),
            "seconds": seconds,
            "mb_per_s": size / 1e6 / seconds,
            "files_per_s": files / seconds,
            "vs_tar": statistics.median(r["tar"] / r["seconds"] for r in mine),
        }
        if "cpu_seconds" in mine[0]:
            cpu = statistics.median(r["cpu_seconds"] for r in mine)
            row |= {"cpu_seconds": cpu, "wall_per_cpu_per_core": seconds / (cpu / cores)}
        rows.append(row)
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    print("\n| run | seconds | MB/s | files/s | × tar | CPU s | wall ÷ (CPU s ÷ cores) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        cpu = f"{row['cpu_seconds']:.2f}" if "cpu_seconds" in row else "—"
        busy = f"{row['wall_per_cpu_per_core']:.2f}" if "cpu_seconds" in row else "—"
        print(
            f"| {row['run']} | {row['seconds']:.2f} | {row['mb_per_s']:.0f} | "
            f"{row['files_per_s']:,.0f} | {row['vs_tar']:.2f} | {cpu} | {busy} |"
        )


def print_stages(stages: dict[str, dict[str, float]], tar_per_file: float) -> list[dict[str, Any]]:
    """The stage table, the default check's shares, and the ImageNet projection."""
    share = scan_share(stages)
    print("\n| stage | where | CPU µs/image | wall µs/image | share of a `scan` run's CPU |")
    print("|---|---|---:|---:|---:|")
    for name, cost in stages.items():
        if name.startswith("_"):
            continue
        where = ("pool" if name in PARALLEL else "writing thread" if name in WRITER
                 else "finishing thread" if name in FINISHER
                 else "receiving thread" if name == RECEIVER else "—")  # fmt: skip
        part = f"{share[name]:.0%}" if name in share else "—"
        print(f"| {name} | {where} | {cost['cpu'] * 1e6:.0f} | {cost['wall'] * 1e6:.0f} | {part} |")
    projections = []
    scale = IMAGENET_MEAN_BYTES / stages["_bytes"]["cpu"]  # every stage costs ~ its bytes
    tar = tar_per_file * scale * IMAGENET_FILES  # tar is one thread, whatever the cores
    print(f"\n| ImageNet, 1,281,167 files (`tar cf`: {tar / 60:.1f} min) | cores | predicted "
          "minutes | × tar | bound by | CPU minutes |\n|---|---:|---:|---:|---|---:|")  # fmt: skip
    scaled = {k: {"cpu": v["cpu"] * scale, "wall": v["wall"] * scale} for k, v in stages.items()}
    for check in ("fast", "scan"):
        for cores in (8, 32):
            p = project(scaled, check, cores, IMAGENET_FILES) | {"check": check}
            p["vs_tar"] = tar / p["seconds"]
            projections.append(p)
            print(f"| `--check {check}` | {cores} | {p['seconds'] / 60:.1f} | {p['vs_tar']:.2f} | "
                  f"{p['bound_by']} | {p['cpu_seconds'] / 60:.1f} |")  # fmt: skip
    return projections


IMAGENET_FILES = 1_281_167
IMAGENET_MEAN_BYTES = 110_000  # ~140 GB / 1.28 M files


def main(args: argparse.Namespace) -> int:
    src = prepare(args.data, args.images)
    out = args.data / "out"
    out.mkdir(parents=True, exist_ok=True)
    files, size = tree_bytes(src)
    if args.profile:
        print(profile(src, out / "profiled.lmdb", args))
    load_before = os.getloadavg()
    runs = rounds(src, out, args)
    startup = None
    if args.dask_workers:
        more, startup = dask_runs(src, out, args)
        runs += more
    rows = summarize(runs, files, size)
    print(f"\n{files} files, {size / 1e6:.1f} MB, shards of {args.shard_size}, "
          f"{args.repeats} interleaved round(s), load average {load_before[0]:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after, {available_cpus()} CPUs")  # fmt: skip
    if startup is not None:
        print(f"dask LocalCluster start-up (not in the times below): {startup:.1f} s")
    print_rows(rows)
    stages = projections = None
    if args.stages:
        stages = measure_stages(src, out, repeats=args.repeats)
        tar_row = next(r for r in rows if r["run"] == "tar cf")
        projections = print_stages(stages, tar_row["seconds"] / files)
    report = {
        "command": " ".join(sys.argv),
        "machine": machine_info(),
        "load_average": [load_before, os.getloadavg()],
        "files": files,
        "bytes": size,
        "formats": args.formats,
        "shard_size": args.shard_size,
        "dask_startup_s": startup,
        "results": rows,
        "runs": runs,
        "stages": stages,
        "projections": projections,
    }
    path = args.out if args.out.suffix == ".json" else args.out / "scale_convert.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
