#!/usr/bin/env python
"""Read throughput of packer's formats against a plain JPEG folder, through a real DataLoader.

Generates (or reuses) a photo-like JPEG tree under ``--data``, converts it to ``.lmdb``, ``.h5``,
``.npy`` and ``.bmp`` (reusing complete outputs of the same size), then times full passes over
every dataset with ``packer.diagnosis.timing.measure_throughput``:

- datasets: the JPEG folder (``packer.FolderDataset``, the baseline), an in-memory list of the
  same JPEG bytes (the ceiling: no I/O at all), each packed output (``packer.open_dataset``) and,
  in bytes mode, a plain py-lmdb reader of the LMDB output
  (``harness.plain_lmdb.PlainLMDBDataset``, the baseline of packer's LMDB reader);
- modes: ``bytes`` (``output="bytes"``) and ``decoded`` (``output="numpy"``);
- ``num_workers`` 0 and 2, batch 64, page cache ``warm`` (files read once just before the pass)
  and ``cold`` (``packer.diagnosis.targets.evict_page_cache`` just before the pass; residency is checked
  with ``mincore`` and recorded); in bytes mode with workers > 0 also ``packer.collate_bytes``.

Every configuration runs ``--repeats`` times, interleaved (one pass of each configuration per
round, every other round in reverse order), and the median pass is reported with its ratio to
the JPEG folder measured in the same run and the same (mode, workers, cache) setting, and to
the in-memory ceiling.

Each pass runs in a freshly forked child of the same parent, so nothing one pass leaves behind
(an allocator setting such as packer's ``mallopt``, heap layout, open LMDB environments, mapped
shards: a mapped page cannot be evicted, which would make "cold" warm) reaches the next; the
child builds a fresh dataset and closes its reader at the end. By default (``--allocator same``)
each child first applies packer's allocator setting (``packer.core.handles.keep_freed_heap``), so the
baselines run under the same glibc trim threshold as packer's readers; ``--allocator default``
leaves it to packer's readers (the baselines then run with glibc's default). Each pass also records its CPU time and page faults (this process and its reaped DataLoader workers) and
the share of the CPUs other processes used meanwhile; on a shared machine the script first waits
(``--quiet-below``, within ``--wait-budget`` seconds in all) for other processes to go quiet.

Usage::

    python benchmarks/read_throughput.py --quick          # 500 images, 1 round: a smoke test
    python benchmarks/read_throughput.py                  # 5000 images, 3 rounds
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.host_load import QuietWaiter, add_quiet_options
from harness.record import report_head, run_costs, save_report, stamped_log
from harness.throughput import (
    CLASSES,
    FOLDER,
    FORMATS,
    MEMORY,
    MODES,
    PLAIN_LMDB,
    ThroughputBench,
    make_configs,
    prepare_images,
    run_rounds,
)
from harness.throughput_report import (
    evaluate_targets,
    machine_info,
    markdown_table,
    summarise,
    targets_table,
)

from packer.diagnosis.targets import disk_bytes


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data"), help="work folder")
    parser.add_argument("--images", type=int, default=5000, help="images (a multiple of 10)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="num_workers")
    parser.add_argument(
        "--cold-decoded-workers",
        type=int,
        nargs="*",
        default=[0],
        help="num_workers measured in decoded mode with a cold cache (default 0 only, which keeps "
        "the full run near 15 min on 2 cores; pass e.g. '0 2' for the whole matrix)",
    )
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--caches", nargs="+", choices=["warm", "cold"], default=["warm", "cold"])
    parser.add_argument(
        "--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS), help="packed formats"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="JSON folder")
    add_quiet_options(parser)
    parser.add_argument(
        "--allocator",
        choices=["same", "default"],
        default="same",
        help="same: every pass applies packer's M_TRIM_THRESHOLD (keep_freed_heap) first, "
        "baselines included; default: only packer's readers set it",
    )
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        default=0,
        help="what-if: also set glibc's M_MMAP_THRESHOLD to this many bytes in every pass "
        "(0: leave it; keep_freed_heap's M_TRIM_THRESHOLD freezes it at 128 KiB)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every pass in this process instead of a fresh forked child (for profiling)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: 500 images, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats = 500, 1
    if args.images < CLASSES or args.images % CLASSES:
        parser.error(f"--images must be a positive multiple of {CLASSES}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(args: argparse.Namespace) -> int:
    """Prepare the data, run every configuration, print the tables, write the JSON."""
    started = time.perf_counter()
    log = stamped_log(started)

    info = machine_info()
    log(f"{info['platform']}, {info['cpu_count']} CPUs, torch {info['torch']}")
    args.data.mkdir(parents=True, exist_ok=True)
    formats = {name: FORMATS[name] for name in args.formats}
    src, outputs = prepare_images(args.data, args.images, log, formats)
    bench = ThroughputBench(
        src,
        outputs,
        args.batch_size,
        in_process=args.in_process,
        same_allocator=args.allocator == "same",
        mmap_threshold=args.mmap_threshold,
    )
    names = [n for name in outputs for n in ([name, PLAIN_LMDB] if name == "lmdb" else [name])]
    configs = make_configs(
        [FOLDER, MEMORY, *names], args.modes, args.workers, args.caches, args.cold_decoded_workers
    )
    log(f"{len(configs)} configurations × {args.repeats} interleaved rounds")
    waiter = QuietWaiter(args.quiet_below, args.wait_budget) if args.wait_budget > 0 else None
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    rows = summarise(configs, run_rounds(bench, configs, args.repeats, waiter, log))
    checks = evaluate_targets(rows, list(outputs))
    cold = [r["resident_before"][1] for r in rows if r["cache"] == "cold" and r["resident_before"]]
    if waiter is not None:
        log(f"waited {waiter.waited:.0f} s in all for other processes to go quiet")
    if cold and max(cold) > 0.01:
        log(f"WARNING: up to {100 * max(cold):.1f}% of a dataset stayed cached before a cold pass")
    print(markdown_table(rows), "", targets_table(checks), sep="\n")
    load_after = os.getloadavg() if hasattr(os, "getloadavg") else None
    report: dict[str, Any] = {
        **report_head("read_throughput", info, args),
        "images": args.images,
        "disk_bytes": {FOLDER: disk_bytes(src), **{n: disk_bytes(p) for n, p in outputs.items()}},
        **run_costs(started, waiter.waited if waiter else 0.0, load_before, load_after),
        "results": rows,
        "targets": checks,
    }
    path = save_report(args.out / "read_throughput.json", report)
    log(f"wrote {path} (total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
