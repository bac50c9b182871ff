#!/usr/bin/env python
"""Decode + 224-px training crop through a DataLoader: issue 11's targets, in one run.

Generates (or reuses) photo-like JPEG trees under ``--data`` — ``--images`` 400×350 JPEGs
(``bench-data/n<images>/images``, shared with ``read_throughput.py``) and, unless
``--large-images 0``, ``--large-images`` of ``--large-size`` (default 1000 of 1024×768) — and
converts each to a packed LMDB (the same bytes), an LMDB resized at write time
(``packer.convert(..., short_side=256)``) and, when packer supports it, decoded 112×112 pixels
(``packer.convert(..., size=112)`` to ``.npy``). Then it times full passes through a real
DataLoader (``packer.diagnosis.timing.measure_throughput``, batch 64, ``default_collate`` into one
B×3×H×W uint8 tensor) at each of ``--workers``, page cache warm (every file read once before
each pass), each pass in a freshly forked child:

- ``baseline``: the JPEG folder (``packer.FolderDataset``), Pillow decode, then torchvision's
  RandomResizedCrop(224) on the decoded image (``harness.decode_bench.DecodeThenCrop``);
- ``lmdb pillow`` / ``lmdb fast``: the packed LMDB, Pillow / the fast decoder, decode-then-crop;
- ``s256 pillow`` / ``s256 fast``: the ``short_side=256`` LMDB, decode-then-crop;
- ``fused pillow`` / ``fused fast``: the packed LMDB with ``output="bytes"`` and
  ``packer.decode.transforms.RandomResizedCrop(224)`` (crop-aware scaled decode);
- ``npy112``: stored 112×112 pixels, ``output="tensor"`` + a random flip (no decode).

Each (images, row, workers) runs ``--repeats`` times, interleaved; the table shows the median,
its ratio to the baseline in the same setting, and each target (``× versus``) met or missed.
Writes ``--out``/decode.json.

Usage::

    python benchmarks/decode.py --quick    # 500 + 100 images, 1 round: a smoke run
    python benchmarks/decode.py            # 5000 400×350 + 1000 1024×768, 3 rounds
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.decode_bench import (
    CLASSES,
    make_rows,
    prepare_variant,
    run_rounds,
    warm_up,
)
from harness.decode_report import markdown_table, summarise
from harness.host_load import QuietWaiter, add_quiet_options
from harness.record import report_head, run_costs, save_report, stamped_log
from harness.throughput_report import machine_info

from packer.decode.fast import available
from packer.diagnosis.targets import disk_bytes


def _size(text: str) -> tuple[int, int]:
    width, height = (int(v) for v in text.lower().split("x"))
    return width, height


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data"), help="work folder")
    parser.add_argument("--images", type=int, default=5000, help="400×350 images (× of 10)")
    parser.add_argument(
        "--large-images", type=int, default=1000, help="large images (× of 10; 0: none)"
    )
    parser.add_argument("--large-size", type=_size, default=(1024, 768), help="WxH")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="num_workers")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--crop", type=int, default=224, help="training crop side")
    parser.add_argument(
        "--fast-decoder",
        default="auto",
        help="decoder of the 'fast' rows (auto: the first "
        "installed of simplejpeg, opencv, turbojpeg)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads in each pass's main process (0: torch's default); "
        "DataLoader workers always use 1",
    )
    parser.add_argument("--no-npy112", action="store_true", help="skip the decoded-NPY row")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="JSON folder")
    add_quiet_options(parser)
    parser.add_argument(
        "--in-process", action="store_true", help="no fork per pass (for profilers)"
    )
    parser.add_argument("--quick", action="store_true", help="500 + 100 images, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.large_images, args.repeats = 500, 100, 1
    for n in (args.images, args.large_images):
        if n < 0 or n % CLASSES:
            parser.error(f"image counts must be multiples of {CLASSES}")
    if args.images < CLASSES or args.repeats < 1:
        parser.error(f"--images must be >= {CLASSES} and --repeats >= 1")
    return args


def main(args: argparse.Namespace) -> int:
    """Prepare the data, run every row, print the table, write the JSON."""
    started = time.perf_counter()
    log = stamped_log(started)

    info = machine_info()
    info["fast_decoders"] = list(available())  # "auto" tries them in this order
    for module in ("simplejpeg", "cv2", "turbojpeg"):
        try:
            info[module] = __import__(module).__version__
        except (ImportError, AttributeError):
            pass
    log(f"{info['platform']}, {info['cpu_count']} CPUs, fast decoders {info['fast_decoders']}")
    args.data.mkdir(parents=True, exist_ok=True)
    npy112 = not args.no_npy112
    sets = [("photos", args.images, (400, 350))]
    if args.large_images:
        sets.append(("large", args.large_images, args.large_size))
    variants = [prepare_variant(args.data, *s, log, npy112) for s in sets]
    rows = make_rows(args.fast_decoder, npy112)
    warm_up(variants, rows, args.crop)  # decoder libraries loaded before any pass forks
    waiter = QuietWaiter(args.quiet_below, args.wait_budget) if args.wait_budget > 0 else None
    load_before = os.getloadavg()
    log(f"load average before: {load_before}")
    runs = run_rounds(
        variants,
        rows,
        args.workers,
        args.repeats,
        args.batch_size,
        args.crop,
        waiter,
        log,
        args.in_process,
        args.torch_threads,
    )
    load_after = os.getloadavg()
    log(f"load average after: {load_after}")
    results = summarise(variants, rows, runs)
    print(markdown_table(results))
    for variant in variants:
        for store, note in variant.notes.items():
            print(f"\n{variant.name}: no {store} row: {note}")
    report: dict[str, Any] = {
        **report_head("decode", info, args),
        "cache": "warm: every file of the row read once (mincore-checked) before each pass",
        "variants": [
            {
                "name": v.name,
                "images": v.images,
                "size": list(v.size),
                "disk_bytes": {s: disk_bytes(p) for s, p in v.paths.items() if p},
                "notes": v.notes,
            }
            for v in variants
        ],
        **run_costs(started, waiter.waited if waiter else 0.0, load_before, load_after),
        "results": results,
    }
    path = save_report(args.out / "decode.json", report)
    log(f"wrote {path} (total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
