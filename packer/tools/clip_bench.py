"""Clip-reading throughput of packer's video formats, JPEG frame folders and mp4 seek-decode.

The library half of ``benchmarks/video_clips.py``: the generated frame tree and mp4 files, the
datasets compared (including two hand-written baselines, :class:`WholeFileNpy` and
:class:`Mp4Clips`), the interleaved timed passes (:func:`packer.tools.timing.measure_throughput`)
and the markdown tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from packer.convert import convert_video
from packer.manifest import MANIFEST_NAME
from packer.sampling import clip_indices, clip_rng
from packer.tools.targets import evict_page_cache
from packer.tools.timing import measure_throughput
from packer.tools.video_demo import make_video_tree, write_video
from packer.video.datasets import NpyVideoDataset, VideoDataset, open_video_dataset
from packer.video.load import import_av
from packer.video.sources import scan_videos

__all__ = ["Mp4Clips", "WholeFileNpy", "clips_per_s", "markdown", "prepare", "run"]

FOLDER, MP4, WHOLE = "jpeg frames", "mp4 seek-decode", "npy whole-file"
PACKED = {"npy": ".npy", "h5": ".h5", "lmdb": ".lmdb", "bmp": ".bmp"}
NAMES = [FOLDER, MP4, "npy", WHOLE, "h5", "lmdb", "bmp"]


class WholeFileNpy(NpyVideoDataset):
    """The hand-written reader: load the whole padded ``.npy`` of a video, then pick rows."""

    def read_frames(self, i: int, frames: np.ndarray) -> list[bytes]:
        path = self.root / (self.keys[i] + ".npy")
        rows = np.load(path)[frames]
        lengths = self.reader.lengths(int(self.first[i]) + np.asarray(frames, dtype=np.int64))
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
