"""Clip-reading benchmark of packer's video formats against JPEG frame folders (issue 13).

The library half of ``benchmarks/video_clips.py``:

- :func:`prepare`: a tree of photo-like videos (JPEG frame folders, ``--quality`` 65 gives
  ~23 KB per 320×240 frame, as real footage), converted to ``.npy``, ``.h5``, ``.lmdb`` and
  ``.bmp`` with :func:`packer.convert_video`; optionally the same frames as H.264 mp4;
- :func:`run`: for every dataset, mode (``bytes``: ``output="bytes"``, I/O and format cost only;
  ``decoded``: ``output="numpy"``), ``num_workers`` and page cache (``cold``: every data file
  evicted, ``warm``: every data file resident), one **epoch** (each video once, in a fixed
  shuffled order) through a real DataLoader over a **freshly constructed dataset** (fork, worker
  start-up included), repeated and reported as medians;
- disk bytes per clip: every process that reads (the main process at ``num_workers=0``, each
  worker otherwise) reads its own ``/proc/self/io`` ``read_bytes`` (and ``majflt`` from
  ``/proc/self/stat``) at its first batch and after every batch, and writes the difference into
  its slot of a shared-memory tensor (:class:`CountedClips`); a run's disk bytes are the sum
  over the slots. Payload per clip: the stored bytes of the clip's sampled frames
  (:func:`packer.diagnosis.targets.payload_bytes`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from packer.core.manifest import MANIFEST_NAME
from packer.demo.video import make_video_tree, write_video
from packer.diagnosis.io_counters import read_counters, resident_fraction
from packer.diagnosis.targets import close_dataset, data_files, evict_page_cache, payload_bytes
from packer.diagnosis.timing import time_batches
from packer.read.clip_frames import clip_indices, clip_rng
from packer.read.open import open_video_dataset
from packer.read.video_datasets import NPYVideoDataset, VideoDataset
from packer.source.videos import scan_videos
from packer.write.convert import convert_video
from packer.write.video_load import import_av

__all__ = [
    "CountedClips",
    "Mp4Clips",
    "WholeFileNpy",
    "epoch",
    "prepare",
    "run",
]

FOLDER, MP4, WHOLE = "jpeg frames", "mp4 seek-decode", "npy whole-file"
PACKED = {"npy": ".npy", "h5": ".h5", "lmdb": ".lmdb", "bmp": ".bmp"}
CORE = [FOLDER, "npy", "h5", "lmdb", "bmp"]
EXTRAS = [WHOLE, MP4]


class WholeFileNpy(NPYVideoDataset):
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


# --------------------------------------------------------------------------------------------
# Data


def prepare(
    data: Path,
    videos: int,
    frames: tuple[int, int],
    size: tuple[int, int],
    quality: int = 65,
    mp4: bool = False,
    gop: int = 25,
) -> dict[str, Path]:
    """Generate the frame tree (and mp4s) once per configuration and convert it to every format.

    ``videos`` are spread over 4 classes; each has ``frames[0]..frames[1]`` frames.
    """
    stamp = data / "config.json"
    config = {"videos": videos, "frames": list(frames), "size": list(size), "quality": quality}
    old = json.loads(stamp.read_text()) if stamp.is_file() else {}
    if {k: old.get(k) for k in config} != config:
        classes = 4
        make_video_tree(
            data / "frames", classes, videos // classes, frames, size, quality=quality, seed=1
        )
        for suffix in PACKED.values():
            convert_video(data / "frames", data / f"frames{suffix}", overwrite=True, progress=False)
        old = {**config, "mp4": False, "frame_bytes": tree_bytes(data / "frames")}
        stamp.write_text(json.dumps(old))
    if mp4 and not old.get("mp4"):
        from PIL import Image

        for video in scan_videos(data / "frames").videos:
            images = [Image.open(p) for p in video.frames or ()]
            out = data / "mp4" / f"{video.key}.mp4"
            out.parent.mkdir(parents=True, exist_ok=True)
            write_video(out, images, codec="libx264", gop=gop)
        stamp.write_text(json.dumps({**old, "mp4": True}))
    paths = {FOLDER: data / "frames", MP4: data / "mp4", WHOLE: data / "frames.npy"}
    paths.update({name: data / f"frames{suffix}" for name, suffix in PACKED.items()})
    assert all((paths[n] / MANIFEST_NAME).is_file() for n in PACKED)
    return paths


def tree_bytes(root: Path) -> dict[str, float]:
    """Frames and mean bytes per frame of a frame tree."""
    sizes = [f.stat().st_size for f in root.rglob("*.jpg")]
    return {"frames": len(sizes), "mean": float(np.mean(sizes)), "std": float(np.std(sizes))}


def make_dataset(name: str, path: Path, mode: str, num_frames: int) -> VideoDataset:
    """A fresh dataset: ``segments`` clips of ``num_frames`` frames, seed 0 (same frames for all)."""
    if name == MP4:
        return Mp4Clips(path, num_frames, seed=0)
    output = "numpy" if mode == "decoded" else "bytes"
    if name == WHOLE:
        return WholeFileNpy(path, num_frames=num_frames, sampling="segments", seed=0, output=output)
    return open_video_dataset(
        path, num_frames=num_frames, sampling="segments", seed=0, output=output
    )


# --------------------------------------------------------------------------------------------
# Counting what the disk delivers, in every reading process


class CountedClips(Dataset):
    """Wrap a dataset so each reading process records its own ``/proc/self/io`` counters.

    ``slots`` is a shared-memory int64 tensor of shape ``(1 + workers, 2)``; slot 0 is the main
    process, slot ``1 + id`` DataLoader worker ``id``. Each process reads its counters at its
    first batch (before reading) and, after every batch, stores ``read_bytes`` and ``majflt``
    since then in its slot, so the slots hold exactly the reads of the batches.
    """

    def __init__(self, dataset: Dataset, slots: torch.Tensor) -> None:
        self.dataset, self.slots = dataset, slots
        self._pid: int | None = None
        self._start: Any = None

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        if self._pid != os.getpid():
            self._pid, self._start = os.getpid(), read_counters()
        samples = [self.dataset[i] for i in indices]
        now = read_counters() - self._start
        info = get_worker_info()
        slot = 0 if info is None else info.id + 1
        self.slots[slot, 0] = now.read_bytes
        self.slots[slot, 1] = now.majflt
        return samples


def _list_collate(batch: Sequence[Any]) -> list[Any]:
    return list(batch)


def epoch(
    dataset: VideoDataset, workers: int, batch: int, order: list[int]
) -> tuple[float, int, int]:
    """One timed epoch (``order``) through a fresh DataLoader: seconds, disk bytes, major faults."""
    slots = torch.zeros((1 + workers, 2), dtype=torch.int64).share_memory_()
    loader = DataLoader(
        CountedClips(dataset, slots),
        batch_size=batch,
        sampler=order,
        num_workers=workers,
        collate_fn=_list_collate,
        multiprocessing_context="fork" if workers > 0 else None,
    )
    timing = time_batches(loader)
    del loader
    return timing.seconds, int(slots[:, 0].sum()), int(slots[:, 1].sum())


# --------------------------------------------------------------------------------------------
# The runs


def _warm(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb") as fh:
            while fh.read(8 << 20):
                pass


def run(args: argparse.Namespace, paths: dict[str, Path], log: Any = print) -> list[dict[str, Any]]:
    """Every (dataset, mode, workers, cache), ``args.repeats`` interleaved rounds; one row each.

    ``args``: ``names``, ``modes``, ``workers``, ``cache``, ``repeats``, ``batch``,
    ``num_frames``.
    """
    names = list(args.names)
    configs = [
        (name, mode, workers, cache)
        for cache in args.cache
        for mode in args.modes
        for workers in args.workers
        for name in names
        if not (mode == "bytes" and name == MP4)
    ]
    files = {name: data_files(paths[name]) if name != MP4 else sorted(paths[MP4].rglob("*.mp4"))
             for name in names}  # fmt: skip
    payload: dict[str, float] = {}
    for name in names:  # imports, and the payload of one epoch's clips
        mode = "decoded" if name == MP4 else "bytes"
        dataset = make_dataset(name, paths[name], mode, args.num_frames)
        if name != MP4:
            payload[name] = payload_bytes(dataset, paths[name], range(len(dataset))) / len(dataset)
        epoch(dataset, 0, args.batch, list(range(min(len(dataset), 2 * args.batch))))
        close_dataset(dataset)
    resident = dict.fromkeys(names, False)
    samples: dict[tuple[str, str, int, str], list[dict[str, float]]] = {c: [] for c in configs}
    for round_ in range(args.repeats):
        for name, mode, workers, cache in configs:
            start = time.perf_counter()
            dataset = make_dataset(name, paths[name], mode, args.num_frames)
            opened = time.perf_counter() - start
            order = np.random.default_rng(round_).permutation(len(dataset)).tolist()
            if cache == "cold":
                evict_page_cache(files[name])
                resident[name] = False
            elif not resident[name]:
                _warm(files[name])
                resident[name] = True
            before = resident_fraction(files[name])
            seconds, disk, faults = epoch(dataset, workers, args.batch, order)
            close_dataset(dataset)
            clips = len(order)
            if cache == "cold":
                resident[name] = False  # partly read now: warm it again before a warm run
            sample = {
                "clips_per_s": clips / seconds,
                "seconds": seconds,
                "open_s": opened,
                "disk_per_clip": disk / clips,
                "faults_per_clip": faults / clips,
                "resident_before": before if before is not None else float("nan"),
            }
            samples[name, mode, workers, cache].append(sample)
            log(
                f"[{round_ + 1}/{args.repeats}] {name:16} {mode:7} w={workers} {cache}: "
                f"{sample['clips_per_s']:8,.1f} clips/s, disk {disk / clips / 1e3:8.1f} KB/clip"
            )
    rows = []
    for (name, mode, workers, cache), values in samples.items():
        median = {k: statistics.median(v[k] for v in values) for k in values[0]}
        base = statistics.median(v["clips_per_s"] for v in samples[FOLDER, mode, workers, cache])
        pay = payload.get(name)
        rows.append(
            {
                "dataset": name,
                "mode": mode,
                "workers": workers,
                "cache": cache,
                **median,
                "x_folder": median["clips_per_s"] / base,
                "payload_per_clip": pay,
                "disk_x_payload": median["disk_per_clip"] / pay if pay else None,
                "clips": len(dataset),
                "runs": values,
            }
        )
    return rows


# --------------------------------------------------------------------------------------------
# Report
