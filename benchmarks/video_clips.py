#!/usr/bin/env python
"""Clip-reading throughput of packer's video formats against JPEG frame folders and mp4 seeking.

Generates (or reuses) a tree of photo-like videos under ``--data``: JPEG frame folders
(``frames/<class>/<video>/img_N.jpg``) and the same frames encoded as H.264 mp4 files
(``mp4/<class>/<video>.mp4``, keyframe every ``--gop`` frames), then converts the frame tree to
``.npy``, ``.h5``, ``.lmdb`` and ``.bmp`` with ``packer.video.convert_video``.

It times ``--clips`` clips of ``--num-frames`` frames (TSN ``segments`` sampling, seed 0, so every
dataset reads the same frames) through a real ``DataLoader`` (batch ``--batch``, ``num_workers``
0 and 2, fork, worker start-up included; page cache ``warm`` (read just before) and ``cold``
(``packer.tools.targets.evict_page_cache`` of the dataset's files before each pass)) for:

- ``jpeg frames``: ``packer.video.VideoFolderDataset`` over the frame folders (the baseline);
- ``mp4 seek-decode``: per clip, open the mp4 with PyAV, seek to the keyframe before the first
  sampled frame and decode forward to the last one (decoded mode only);
- ``npy``, ``h5``, ``lmdb``, ``bmp``: ``packer.video.open_video_dataset`` (NPY memory-maps each
  video and copies only the sampled rows);
- ``npy whole-file``: the hand-written approach, ``np.load`` of the whole padded file per clip.

Modes: ``decoded`` (``output="numpy"``, T×H×W×3) and ``bytes`` (``output="bytes"``: I/O and
format cost only). Each configuration runs ``--repeats`` times, interleaved, and the median is
reported with its ratio to the JPEG frame folder and to mp4 seek-decode in the same setting.

Usage::

    python benchmarks/video_clips.py --quick      # 8 videos × 64 frames, 1 round: a smoke test
    python benchmarks/video_clips.py              # 32 videos × 64 frames at 320×240, 3 rounds
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

from packer.tools.clip_bench import markdown, prepare, run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data/video"))
    parser.add_argument("--videos", type=int, default=32, help="videos (4 classes)")
    parser.add_argument("--frames", type=int, default=64, help="frames per video")
    parser.add_argument("--size", default="320x240", help="frame size WxH")
    parser.add_argument("--gop", type=int, default=25, help="mp4 keyframe interval")
    parser.add_argument("--num-frames", type=int, default=8, help="frames per clip")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--clips", type=int, default=128, help="clips per timed pass")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", nargs="+", default=["warm", "cold"], choices=["warm", "cold"])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/video_clips.json"))
    parser.add_argument("--quick", action="store_true", help="8 videos, 64 clips, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.videos, args.clips, args.repeats = 8, 64, 1
    return args


def main(args: argparse.Namespace) -> None:
    width, height = (int(v) for v in args.size.lower().split("x"))
    start = time.perf_counter()
    paths = prepare(args.data, args.videos, args.frames, (width, height), args.gop)
    rows = run(args, paths)
    machine = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": len(__import__("os").sched_getaffinity(0)),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }
    result = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "machine": machine,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(
        f"{args.videos} videos × {args.frames} frames at {args.size}, clips of {args.num_frames} "
        f"(segments), batch {args.batch}, {args.clips} clips per pass, median of {args.repeats}"
    )
    for cache in args.cache:
        print(markdown(rows, args.workers, cache))
    print(f"\nmachine: {machine}\nsaved {args.out} ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main(parse_args())
