#!/usr/bin/env python
"""The every-num_workers-batches stall, reproduced and explained by :func:`packer.diagnose`.

A :class:`harness.sleepy.SleepyDataset` whose items take ``--item-ms`` (storage latency, no CPU) is read through
DataLoaders with each ``--workers`` value while the loop simulates a ``--step-ms`` training
step. For each worker count the table shows the waits, the detected period and the worker
count the formula ``ceil(1.25 × W / t)`` recommends; with enough workers the stall disappears.

Usage::

    python benchmarks/bench_stall.py --workers 2,4,8 --item-ms 10 --batch-size 16 --step-ms 20
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from harness.sleepy import SleepyDataset
from torch.utils.data import DataLoader

from packer.diagnosis.diagnose import diagnose


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", default="2,4,8")
    p.add_argument("--item-ms", type=float, default=10.0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--json", type=Path, default=Path("bench_stall.json"))
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    """Diagnose one loader per worker count and print the table."""
    rows = []
    print("| num_workers | wait p50 ms | p95 ms | max ms | waited | stall | W ms | recommended |")
    print("|--:|--:|--:|--:|--:|---|--:|--:|")
    for workers in (int(w) for w in args.workers.split(",")):
        dataset = SleepyDataset(100_000, args.item_ms / 1e3, time.time() + 0.5)
        loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=workers)
        report = diagnose(loader, steps=args.steps, step_ms=args.step_ms)
        stall = f"every {report.stall.period}" if report.stall.period else report.stall.kind
        w = report.wait
        print(f"| {workers} | {w.p50_ms:.1f} | {w.p95_ms:.1f} | {w.max_ms:.1f} | {100 * report.wait_fraction:.0f} % "
              f"| {stall} | {report.batch_ms:.0f} | {report.recommended_workers} |")  # fmt: skip
        rows.append(report.to_dict())
    args.json.write_text(
        json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": rows}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
