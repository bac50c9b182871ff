#!/usr/bin/env python
"""Packer's LMDB reader against a careful plain py-lmdb reader of the same files, side by side.

The row of issue 23 this answers: in-order bytes, page cache warm, ``num_workers=0``, DataLoader
batch 64 (default: 5,000 photo-like JPEGs). Three datasets run interleaved in one run (one pass
of each per round, every other round in reverse order, each pass in a freshly forked child,
the allocator set alike for all: see ``read_throughput.py``):

- the JPEG folder (``packer.FolderDataset``), the baseline of ``benchmarks/README.md``'s ratios;
- packer's LMDB dataset (``packer.open_dataset(..., output="bytes")``);
- the plain reader (``harness.plain_lmdb.PlainLMDBDataset``: one environment per shard opened
  ``readonly=True, lock=False``, one ``buffers=True`` transaction kept open, one ``getmulti``
  per shard and batch, ``bytes(value)`` per sample).

It reports each one's median pass against the folder, and packer against the plain reader: the
ratio of the median passes, the median of the per-round ratios (each round's two passes ran
back to back) and the same for CPU seconds (steadier than wall time on a shared machine).
``--profile`` instead runs one pass of packer and of the plain reader under ``cProfile`` and
prints where each spends its time.

Usage::

    python benchmarks/lmdb_reader.py --quick        # 500 images, 3 rounds: a smoke test
    python benchmarks/lmdb_reader.py                # 5000 images, 7 rounds
    python benchmarks/lmdb_reader.py --profile      # cProfile of one pass of each reader
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.forked import in_child
from harness.host_load import QuietWaiter, add_quiet_options
from harness.record import report_head, run_costs, save_report, stamped_log
from harness.throughput import (
    CLASSES,
    FOLDER,
    PLAIN_LMDB,
    Config,
    ThroughputBench,
    make_configs,
    prepare_images,
    run_rounds,
)
from harness.throughput_report import machine_info, summarise

from packer.core.handles import keep_freed_heap
from packer.diagnosis.timing import measure_throughput

PACKER = "lmdb"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data"), help="work folder")
    parser.add_argument("--images", type=int, default=5000, help="images (a multiple of 10)")
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (median)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0], help="num_workers")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="JSON folder")
    add_quiet_options(parser)
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every pass in this process instead of a fresh forked child (for tests)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile one pass of each reader")
    parser.add_argument("--quick", action="store_true", help="smoke test: 500 images, 3 rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats = 500, 3
    if args.images < CLASSES or args.images % CLASSES:
        parser.error(f"--images must be a positive multiple of {CLASSES}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def profile_pass(bench: ThroughputBench, name: str, lines: int = 14) -> dict[str, Any]:
    """One warm pass of dataset ``name`` under cProfile (run it in a forked child)."""
    keep_freed_heap()
    dataset = bench.make_dataset(name, "bytes")
    bench.set_cache(Config(name, "bytes", 0, "warm", "default"))
    profiler = cProfile.Profile()
    profiler.enable()
    result = measure_throughput(dataset, batch_size=bench.batch_size)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(lines)
    return {"seconds": result.seconds, "profile": text.getvalue()}


def paired(runs: dict[Config, list[dict[str, Any]]], workers: int, key: str) -> list[float]:
    """Per round, the plain reader's ``key`` (seconds or CPU seconds) over packer's: packer's
    speed as a multiple of the plain reader's, pass against pass of the same round."""
    ours = runs[Config(PACKER, "bytes", workers, "warm", "default")]
    plain = runs[Config(PLAIN_LMDB, "bytes", workers, "warm", "default")]
    return [p[key] / o[key] for o, p in zip(ours, plain) if o[key] > 0]


def comparison(rows: list[dict], runs: dict[Config, list[dict[str, Any]]]) -> list[dict]:
    """Packer against the plain reader, for each ``num_workers``."""
    out = []
    for workers in sorted({r["workers"] for r in rows}):
        row = {r["dataset"]: r for r in rows if r["workers"] == workers}
        ours, plain = row[PACKER], row[PLAIN_LMDB]
        out.append(
            {
                "workers": workers,
                "packer_vs_folder": ours["vs_folder"],
                "plain_vs_folder": plain["vs_folder"],
                "packer_vs_plain": ours["images_per_s"] / plain["images_per_s"],
                "packer_vs_plain_per_round": paired(runs, workers, "seconds"),
                "packer_vs_plain_cpu_per_round": paired(runs, workers, "cpu_s"),
                "others_cpu_share": ours["others_cpu_share"],
            }
        )
    return out


def report_lines(rows: list[dict], checks: list[dict]) -> list[str]:
    """The markdown table of the medians, and packer against the plain reader."""
    lines = [
        "| dataset | workers | images/s | MB/s | × folder | CPU µs/image | spread |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['workers']} | {r['images_per_s']:,.0f} | "
            f"{r['mb_per_s']:,.0f} | {r['vs_folder']:.2f}× | {r['cpu_us_per_image']:.0f} | "
            f"{100 * r['spread']:.0f}% |"
        )
    lines.append("")
    for c in checks:
        lines.append(
            f"num_workers={c['workers']}: packer's LMDB reader is {c['packer_vs_plain']:.2f}× the "
            f"plain reader (medians); per round {statistics.median(c['packer_vs_plain_per_round']):.2f}× "
            f"wall, {statistics.median(c['packer_vs_plain_cpu_per_round']):.2f}× CPU (medians); "
            f"target >= 1.0×"
        )
    return lines


def main(args: argparse.Namespace) -> int:
    """Prepare the data, run the rounds (or the profiles), print the results, write the JSON."""
    started = time.perf_counter()
    log = stamped_log(started)
    info = machine_info()
    log(f"{info['platform']}, {info['cpu_count']} CPUs")
    args.data.mkdir(parents=True, exist_ok=True)
    src, outputs = prepare_images(args.data, args.images, log, {PACKER: ".lmdb"})
    bench = ThroughputBench(src, outputs, args.batch_size, in_process=args.in_process)
    if args.profile:
        for name in (PACKER, PLAIN_LMDB):
            result = in_child(profile_pass, bench, name)
            print(f"## {name}: {result['seconds']:.3f} s under cProfile\n{result['profile']}")
        return 0
    configs = make_configs([FOLDER, PACKER, PLAIN_LMDB], ["bytes"], args.workers, ["warm"])
    log(f"{len(configs)} configurations × {args.repeats} interleaved rounds")
    waiter = QuietWaiter(args.quiet_below, args.wait_budget) if args.wait_budget > 0 else None
    load_before = os.getloadavg()
    runs = run_rounds(bench, configs, args.repeats, waiter, log)
    rows = summarise(configs, runs)
    checks = comparison(rows, runs)
    print("\n".join(report_lines(rows, checks)))
    report: dict[str, Any] = {
        **report_head("lmdb_reader", info, args),
        "images": args.images,
        **run_costs(started, waiter.waited if waiter else 0.0, load_before, os.getloadavg()),
        "results": rows,
        "packer_vs_plain": checks,
    }
    path = save_report(args.out / "lmdb_reader.json", report)
    log(f"wrote {path} (total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
