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
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packer.manifest import MANIFEST_NAME
from packer.sampling import clip_indices, clip_rng
from packer.tools.targets import evict_page_cache
from packer.tools.timing import measure_throughput
from packer.tools.video_demo import make_video_tree, write_video
from packer.video.convert import convert_video
from packer.video.datasets import NpyVideoDataset, VideoDataset, open_video_dataset
from packer.video.load import import_av
from packer.video.sources import scan_videos

FOLDER, MP4, WHOLE = "jpeg frames", "mp4 seek-decode", "npy whole-file"
PACKED = {"npy": ".npy", "h5": ".h5", "lmdb": ".lmdb", "bmp": ".bmp"}
NAMES = [FOLDER, MP4, "npy", WHOLE, "h5", "lmdb", "bmp"]


class WholeFileNpy(NpyVideoDataset):
    """The hand-written reader: load the whole padded ``.npy`` of a video, then pick rows."""

    def _read_frames(self, i: int, frames: np.ndarray) -> list[bytes]:
        path = self.root / (self.keys[i] + ".npy")
        rows = np.load(path)[frames]
        lengths = self.reader.lengths(i)[frames]
        return [row[: int(n)].tobytes() for row, n in zip(rows, lengths)]


class Mp4Clips(VideoDataset):
    """Clips decoded straight from mp4 files with PyAV: seek, then decode forward."""

    def __init__(self, root: Path, num_frames: int, seed: int) -> None:
        source = scan_videos(root)
        self.paths = [v.path for v in source.videos]
        av = import_av()
        counts = []
        for path in self.paths:
            with av.open(path) as container:
                counts.append(container.streams.video[0].frames)
        labels = np.array([v.label for v in source.videos])
        super().__init__(
            root, source.classes, labels, np.array(counts), num_frames, "segments", seed=seed
        )
        self.output = "numpy"

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        wanted = clip_indices(
            int(self.frame_counts[i]), self.num_frames, "segments", clip_rng(self.seed, 0, i)
        )
        av = import_av()
        got: dict[int, np.ndarray] = {}
        with av.open(self.paths[i]) as container:
            stream = container.streams.video[0]
            start, base, rate = stream.start_time or 0, stream.time_base, stream.average_rate
            container.seek(start + int(int(wanted[0]) / rate / base), stream=stream, backward=True)
            for frame in container.decode(stream):
                number = round((frame.pts - start) * base * rate)
                if number in wanted:
                    got[number] = frame.to_ndarray(format="rgb24")
                if number >= wanted[-1]:
                    break
        return np.stack([got[int(j)] for j in wanted]), int(self.targets[i])


def prepare(
    data: Path, videos: int, frames: int, size: tuple[int, int], gop: int
) -> dict[str, Path]:
    """Generate the frame tree and mp4s (once per configuration) and convert to every format."""
    stamp = data / "config.json"
    config = {"videos": videos, "frames": frames, "size": list(size), "gop": gop}
    if not stamp.is_file() or json.loads(stamp.read_text()) != config:
        classes = 4
        tree = make_video_tree(
            data / "frames", classes, videos // classes, (frames, frames), size, seed=1
        )
        from PIL import Image

        for folder in tree.videos:
            images = [
                Image.open(p) for p in sorted(folder.iterdir(), key=lambda p: int(p.stem[4:]))
            ]
            out = data / "mp4" / folder.parent.name / f"{folder.name}.mp4"
            out.parent.mkdir(parents=True, exist_ok=True)
            write_video(out, images, codec="libx264", gop=gop)
        for suffix in PACKED.values():
            convert_video(data / "frames", data / f"frames{suffix}", overwrite=True, progress=False)
        stamp.write_text(json.dumps(config))
    paths = {FOLDER: data / "frames", MP4: data / "mp4", WHOLE: data / "frames.npy"}
    paths.update({name: data / f"frames{suffix}" for name, suffix in PACKED.items()})
    assert all((paths[n] / MANIFEST_NAME).is_file() for n in PACKED)
    return paths


def make_dataset(name: str, path: Path, mode: str, num_frames: int) -> VideoDataset:
    if name == MP4:
        return Mp4Clips(path, num_frames, seed=0)
    output = "numpy" if mode == "decoded" else "bytes"
    if name == WHOLE:
        return WholeFileNpy(path, num_frames=num_frames, sampling="segments", seed=0, output=output)
    return open_video_dataset(
        path, num_frames=num_frames, sampling="segments", seed=0, output=output
    )


def clips_per_s(dataset: VideoDataset, workers: int, batch: int, clips: int) -> float:
    """Time ``clips`` clips (a fixed random order over the videos) through a DataLoader."""
    order = np.random.default_rng(0).integers(0, len(dataset), clips).tolist()
    run = measure_throughput(dataset, workers, batch, sampler=order, multiprocessing_context="fork")
    return run.images_per_s


def files_of(path: Path) -> list[Path]:
    """Every file a dataset reads (to evict from the page cache)."""
    return [p for p in path.rglob("*") if p.is_file()]


def run(args: argparse.Namespace, paths: dict[str, Path]) -> list[dict[str, Any]]:
    configs = [
        (name, mode, workers, cache)
        for cache in args.cache
        for mode in ("decoded", "bytes")
        for name in NAMES
        if not (mode == "bytes" and name == MP4)
        for workers in args.workers
    ]
    for name in NAMES:  # warm-up: page cache, imports
        dataset = make_dataset(name, paths[name], "decoded", args.num_frames)
        clips_per_s(dataset, 0, args.batch, args.batch)
    files = {name: files_of(path) for name, path in paths.items()}
    runs: dict[tuple[str, str, int, str], list[float]] = {c: [] for c in configs}
    for _ in range(args.repeats):
        for name, mode, workers, cache in configs:
            dataset = make_dataset(name, paths[name], mode, args.num_frames)
            if cache == "cold":
                evict_page_cache(files[name])
            else:  # warm: every file read just before
                for path in files[name]:
                    path.read_bytes()
            speed = clips_per_s(dataset, workers, args.batch, args.clips)
            runs[name, mode, workers, cache].append(speed)
    rows = []
    for (name, mode, workers, cache), values in runs.items():
        median = statistics.median(values)
        folder = statistics.median(runs[FOLDER, mode, workers, cache])
        mp4 = statistics.median(runs[MP4, "decoded", workers, cache])
        rows.append(
            {
                "dataset": name,
                "mode": mode,
                "workers": workers,
                "cache": cache,
                "clips_per_s": median,
                "runs": values,
                "x_folder": median / folder,
                "x_mp4": median / mp4 if mode == "decoded" else None,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]], workers: list[int], cache: str) -> str:
    rows = [r for r in rows if r["cache"] == cache]
    lines = [f"\n### page cache: {cache}"]
    for mode in ("decoded", "bytes"):
        head = " | ".join(
            f"w={w} clips/s | × frames" + (" | × mp4" if mode == "decoded" else "") for w in workers
        )
        lines += [f"\n**{mode}** ({cache} cache)\n", f"| dataset | {head} |"]
        lines.append("|---|" + "---:|" * (len(workers) * (3 if mode == "decoded" else 2)))
        for name in NAMES:
            cells = []
            for w in workers:
                row = next(
                    (r for r in rows if (r["dataset"], r["mode"], r["workers"]) == (name, mode, w)),
                    None,
                )
                if row is None:
                    continue
                cells += [f"{row['clips_per_s']:,.1f}", f"{row['x_folder']:.2f}"]
                if mode == "decoded":
                    cells.append(f"{row['x_mp4']:.2f}")
            if cells:
                lines.append(f"| {name} | " + " | ".join(cells) + " |")
    by = {(r["dataset"], r["mode"], r["workers"]): r["clips_per_s"] for r in rows}
    lines.append("")
    for mode in ("bytes", "decoded"):
        ratios = ", ".join(
            f"w={w}: {by['npy', mode, w] / by[WHOLE, mode, w]:.2f}×" for w in workers
        )
        lines.append(f"NPY sampled rows vs whole-file ({mode}, {cache}): {ratios}")
    return "\n".join(lines)


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
