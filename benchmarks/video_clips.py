#!/usr/bin/env python
"""Clip reading of packer's video formats against JPEG frame folders: one epoch, cold and warm.

Issue 13's benchmark. Generates (or reuses) ``--videos`` photo-like videos under ``--data``
(4 classes, ``--frames`` frames each at ``--size``, JPEG quality ``--quality``: ~23 KB per
320×240 frame), converts the frame tree to ``.npy``, ``.h5``, ``.lmdb`` and ``.bmp``, then for
the frame folders and each format, for ``output="bytes"`` and ``"numpy"`` (decoded),
``num_workers`` 0 and 2, page cache cold (every data file evicted with ``posix_fadvise``
DONTNEED) and warm (every data file read just before): one epoch (each video once, shuffled,
8-frame TSN ``segments`` clips, seed 0) through a DataLoader over a freshly constructed
dataset, with fork workers started inside the timed epoch. Reports the median clips/s of
``--repeats`` interleaved rounds, the ratio to the frame folders, the disk bytes per clip
(``read_bytes`` of ``/proc/self/io``, summed over every reading process: see
:class:`harness.clip_bench.CountedClips`) and the payload per clip.

Usage::

    python benchmarks/video_clips.py --prepare-only           # generate + convert (untimed)
    flock /tmp/packer-bench.lock python benchmarks/video_clips.py
    python benchmarks/video_clips.py --quick                  # 16 small videos: a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch
from harness.clip_bench import CORE, EXTRAS, prepare, run
from harness.clip_report import markdown, open_text, targets_text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data/video"))
    parser.add_argument("--videos", type=int, default=400, help="videos (4 classes)")
    parser.add_argument("--frames", default="82,100", help="min,max frames per video")
    parser.add_argument("--size", default="320x240", help="frame size WxH")
    parser.add_argument("--quality", type=int, default=65, help="JPEG quality of the frames")
    parser.add_argument("--num-frames", type=int, default=8, help="frames per clip")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--modes", nargs="+", default=["bytes", "decoded"],
                        choices=["bytes", "decoded"])  # fmt: skip
    parser.add_argument("--cache", nargs="+", default=["cold", "warm"], choices=["warm", "cold"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--extras", action="store_true",
                        help="also NPY whole-file loads and mp4 seek-decode (generates mp4s)")  # fmt: skip
    parser.add_argument("--prepare-only", action="store_true", help="generate and convert, exit")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/video_clips.json"))
    parser.add_argument("--report", type=Path, help="print the tables of a saved JSON, exit")
    parser.add_argument("--quick", action="store_true", help="16 videos of 20-30 frames, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.videos, args.frames, args.repeats = 16, "20,30", 1
        args.data = args.data.with_name(args.data.name + "-quick")
    return args


def report(result: dict[str, Any]) -> None:
    """Print the tables and the targets of a result (as saved in the JSON)."""
    args, rows, data = result["args"], result["rows"], result["data"]
    print(
        f"\n{args['videos']} videos × {args['frames']} frames at {args['size']} (JPEG "
        f"q{args['quality']}, {data['frame_bytes']['mean'] / 1e3:.1f} KB per frame), "
        f"{args['num_frames']}-frame segments clips, batch {args['batch']}, one epoch per run, "
        f"median of {args['repeats']}\n"
    )
    for mode in args["modes"]:
        for cache in args["cache"]:
            print(markdown(rows, args["names"], args["workers"], mode, cache) + "\n")
    if "bytes" in args["modes"]:
        print(open_text(rows, args["names"], args["workers"]) + "\n")
    for line in targets_text(rows, args["workers"]):
        print(f"- {line}")
    print(f"\nmachine: {result['machine']}\ncommand: {result['command']}")


def main(args: argparse.Namespace) -> None:
    if args.report is not None:
        report(json.loads(args.report.read_text()))
        return
    width, height = (int(v) for v in args.size.lower().split("x"))
    low, high = (int(v) for v in args.frames.split(","))
    start = time.perf_counter()
    paths = prepare(args.data, args.videos, (low, high), (width, height), args.quality,
                    mp4=args.extras)  # fmt: skip
    data = json.loads((args.data / "config.json").read_text())
    print(f"data ready in {time.perf_counter() - start:.0f} s: {data}", flush=True)
    if args.prepare_only:
        return
    args.names = CORE + (EXTRAS if args.extras else [])
    load = os.getloadavg()
    rows = run(args, paths, log=lambda line: print(line, flush=True))
    machine = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": len(os.sched_getaffinity(0)),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "loadavg_before": load,
        "loadavg_after": os.getloadavg(),
    }
    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "machine": machine,
        "data": data,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    report(result)
    print(f"saved {args.out} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main(parse_args())
