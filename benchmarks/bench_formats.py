#!/usr/bin/env python
"""``packer bench`` as a script: a JPEG folder against its packed copies, with storage counters.

Generates (or reuses) a photo-like tree under ``--data``, converts it to each ``--formats``
suffix, then runs :func:`packer.bench.bench.run_bench` over the folder (the baseline) and the packed
outputs, and :func:`packer.bench.storage_cost.measure_storage` for the per-sample kernel counters.
Prints markdown tables and saves JSON with the machine and the command.

Usage::

    python benchmarks/bench_formats.py --images 400 --workers 0,2 --modes bytes,decode --cold
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.throughput import prepare_images

from packer.bench.bench import BenchSpec, run_bench
from packer.bench.bench_report import runs_table, stalls_text, storage_table, write_json
from packer.bench.storage_cost import measure_storage
from packer.diagnosis.targets import path_labels


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data"), help="work folder")
    p.add_argument("--images", type=int, default=400, help="JPEGs to generate (a multiple of 10)")
    p.add_argument("--formats", default=".lmdb,.npy,.h5", help="suffixes to convert to")
    p.add_argument("--workers", default="0,2", help="num_workers values")
    p.add_argument("--modes", default="bytes,decode", help="bytes, decode, transform")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--cold", action="store_true", help="evict the page cache before each epoch")
    p.add_argument("--json", type=Path, default=Path("bench_formats.json"))
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    """Run the benchmark and print its tables."""
    formats = {s.lstrip("."): s for s in args.formats.split(",") if s}
    src, outputs = prepare_images(
        args.data, args.images, lambda line: print(line, file=sys.stderr), formats
    )
    paths = [src, *outputs.values()]
    spec = BenchSpec(
        workers=[int(w) for w in args.workers.split(",")],
        modes=args.modes.split(","),
        batch_size=args.batch_size,
        epochs=args.epochs,
        cold=args.cold,
    )
    costs = [
        measure_storage(p, label, batch_size=args.batch_size)
        for p, label in zip(paths, path_labels(paths))
    ]
    runs = []
    for run in run_bench(paths, spec):
        runs.append(run)
        print(
            f"{run.label} {run.mode} workers={run.workers} {run.cache}: {run.images_per_s:,.0f} images/s",
            file=sys.stderr,
        )
    print(storage_table(costs), "", runs_table(runs), *stalls_text(runs), sep="\n")
    write_json(args.json, runs, costs, {k: str(v) for k, v in vars(args).items()})
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
