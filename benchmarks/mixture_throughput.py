#!/usr/bin/env python
"""Throughput of a ``packer.Mixture`` of two packed outputs (an LMDB and an NPY of different demo
JPEGs) against reading the two one after the other, with the same sampler
(``packer.ShardedSampler``) and ``DataLoader(num_workers=--workers)``, warm and cold.

Each pass reads ``--epochs`` epochs (every sample of both outputs once per epoch: the mixture's
default weights) in a freshly forked child. ``cold``: every data file of both outputs is evicted
from the page cache before each epoch (``POSIX_FADV_DONTNEED`` after ``sync``); ``warm``: every
file is read in before each epoch. Also recorded, for the pass's process and its DataLoader workers:
the CPU seconds per image and the bytes fetched from storage per epoch (``/proc/self/io``
``read_bytes``), which other processes' load changes far less than the wall time. The
passes of a round run interleaved (mixture, baseline, then the other way round the next round),
so the ratio compares passes made under the same load; the table gives the median images/s of
each and the median of the rounds' ratios. See ``harness.mixture_bench`` for the baseline.

Usage::

    python benchmarks/mixture_throughput.py --data /tmp/packer-mix --images 2000 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.forked import in_child
from harness.host_load import QuietWaiter, add_quiet_options
from harness.mixture_bench import KINDS, one_pass
from harness.record import report_head, save_report, stamped_log
from harness.throughput_report import machine_info

import packer
from packer.core.manifest import MANIFEST_NAME, load_manifest
from packer.core.sizes import parse_size
from packer.demo.image import make_image_tree

TARGET = 0.95


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data/mixture"))
    p.add_argument("--images", type=int, default=2000, help="images of each output")
    p.add_argument("--shard-size", default="16MB")
    p.add_argument("--mode", choices=("bytes", "numpy"), default="bytes")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--epochs", type=int, default=3, help="epochs per pass (each made cold/warm)")
    p.add_argument("--caches", nargs="+", choices=("cold", "warm"), default=["cold", "warm"])
    add_quiet_options(p, below=0.3, budget=120.0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/mixture_throughput.json"))
    return p.parse_args(argv)


def prepare(args: argparse.Namespace, log: Any) -> tuple[Path, Path]:
    """The LMDB (seed 1) and NPY (seed 2) outputs of ``--images`` photo-like JPEGs, made once."""
    out = []
    for fmt, seed in (("lmdb", 1), ("npy", 2)):
        stem = f"n{args.images}-s{seed}"
        dst = args.data / f"{stem}-{args.shard_size}.{fmt}"
        if not (dst / MANIFEST_NAME).is_file() or load_manifest(dst).num_samples != args.images:
            src = args.data / stem
            if not src.is_dir() or sum(1 for _ in src.rglob("*.JPEG")) != args.images:
                log(f"generating {args.images} JPEGs in {src}")
                make_image_tree(src, classes=10, per_class=args.images // 10, bad=0, seed=seed)
            log(f"converting to {dst}")
            packer.convert(
                src, dst, shard_size=parse_size(args.shard_size), overwrite=True, progress=False
            )
        out.append(dst)
    return out[0], out[1]


def run(args: argparse.Namespace, paths: tuple[Path, Path], log: Any) -> list[dict[str, Any]]:
    """Every (cache, kind) ``--repeats`` times, rounds interleaved; one row per cache."""
    passes: dict[tuple[str, str], list[dict[str, Any]]] = {}
    waiter = QuietWaiter(args.quiet_below, args.wait_budget) if args.wait_budget > 0 else None
    for r in range(args.repeats):
        for cache in args.caches:
            for kind in KINDS if r % 2 == 0 else KINDS[::-1]:
                waited = waiter.wait() if waiter is not None else 0.0
                result = in_child(
                    one_pass, kind, paths, cache, args.mode, args.workers, args.batch_size,
                    args.epochs,
                )  # fmt: skip
                result["waited_s"] = waited
                passes.setdefault((cache, kind), []).append(result)
                log(
                    f"round {r + 1} {cache} {kind}: {result['images_per_s']:,.0f} img/s, "
                    f"{result['cpu_us_per_image']:.0f} µs CPU/img, "
                    f"{result['disk_mb_per_epoch']:.0f} MB from disk/epoch, others "
                    f"{result['others_cpu_share']}, waited {waited:.1f} s"
                )
    rows = []
    for cache in args.caches:
        mix, base = passes[cache, KINDS[0]], passes[cache, KINDS[1]]
        ratios = [m["images_per_s"] / b["images_per_s"] for m, b in zip(mix, base)]
        rows.append(
            {
                "cache": cache,
                "mixture_images_per_s": statistics.median(p["images_per_s"] for p in mix),
                "baseline_images_per_s": statistics.median(p["images_per_s"] for p in base),
                "ratio_of_medians": statistics.median(p["images_per_s"] for p in mix)
                / statistics.median(p["images_per_s"] for p in base),
                "median_round_ratio": statistics.median(ratios),
                "mixture_cpu_us_per_image": statistics.median(p["cpu_us_per_image"] for p in mix),
                "baseline_cpu_us_per_image": statistics.median(p["cpu_us_per_image"] for p in base),
                "mixture_disk_mb_per_epoch": statistics.median(p["disk_mb_per_epoch"] for p in mix),
                "baseline_disk_mb_per_epoch": statistics.median(
                    p["disk_mb_per_epoch"] for p in base
                ),
                "round_ratios": ratios,
                "passes": {"mixture": mix, "one after other": base},
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README's table."""
    lines = [
        "| cache | mixture img/s | one after other img/s | ratio of medians | rounds' ratios "
        f"(median) | ≥ {TARGET}× | CPU µs/img mixture / other | disk MB/epoch mixture / other |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        each = ", ".join(f"{x:.3f}" for x in r["round_ratios"])
        ok = "yes" if r["median_round_ratio"] >= TARGET else "**no**"
        lines.append(
            f"| {r['cache']} | {r['mixture_images_per_s']:,.0f} | "
            f"{r['baseline_images_per_s']:,.0f} | {r['ratio_of_medians']:.3f} | "
            f"{each} ({r['median_round_ratio']:.3f}) | {ok} | "
            f"{r['mixture_cpu_us_per_image']:.0f} / {r['baseline_cpu_us_per_image']:.0f} | "
            f"{r['mixture_disk_mb_per_epoch']:.0f} / {r['baseline_disk_mb_per_epoch']:.0f} |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Measure, print the table, write the JSON."""
    started = time.perf_counter()
    log = stamped_log(started)
    paths = prepare(args, log)
    shards = [len(load_manifest(p).shards) for p in paths]
    rows = run(args, paths, log)
    print(f"{args.images} images per output, shards {shards}, mode {args.mode}, "
          f"workers {args.workers}, batch {args.batch_size}\n")  # fmt: skip
    print(markdown(rows))
    report = {**report_head("mixture_throughput", machine_info(), args), "shards": shards}
    save_report(args.out, {**report, "results": rows}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
