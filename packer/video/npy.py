"""NPY video layout: one ``<class>/<video>.npy`` per video, frames as zero-padded rows.

Each file is a plain ``.npy`` array of shape ``(frames, max_frame_bytes)``, dtype uint8: row
``j`` holds frame ``j``'s encoded bytes followed by zeros up to the video's largest frame. The
true length of every frame is in ``frames.npy`` (``packer.video.layout``), so decoding never
sees the padding. ``np.load(path, mmap_mode="r")`` opens a file; the reader memory-maps it and
copies out only the sampled rows. A manifest entry::

    {"format": "npy", "kind": "video", "layout_version": 1, "shards": [],
     "options": {"storage": {"padding_overhead": 1.31, ...}, ...}}
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from packer.formats.npy import MappedArray
from packer.manifest import Manifest
from packer.video.common import PerVideoWriter, VideoReaderBase, video_file

__all__ = ["NAME", "Reader", "Writer"]

NAME = "npy"
SUFFIX = ".npy"
SHARDED = False
TRANSCODE = None


def padded(frames: list[bytes]) -> np.ndarray:
    """The ``(frames, max_frame_bytes)`` uint8 array of zero-padded rows."""
    width = max(len(f) for f in frames)
    rows = np.zeros((len(frames), width), dtype=np.uint8)
    for row, frame in zip(rows, frames):
        row[: len(frame)] = np.frombuffer(frame, dtype=np.uint8)
    return rows


class Writer(PerVideoWriter):
    """Write one padded ``.npy`` per video; a context manager."""

    def write(self, key: str, label: int, frames: list[bytes]) -> int:
        """Write one video; return its shard (-1: the video is its own file)."""
        path = video_file(self.root, key, SUFFIX)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            np.save(fh, padded(frames), allow_pickle=False)
        self.data_bytes += path.stat().st_size
        return -1


class Reader(VideoReaderBase):
    """Read sampled frames from memory-mapped per-video ``.npy`` files."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        index: np.ndarray,
        frame_lengths: np.ndarray,
        max_open_files: int = 128,
    ) -> None:
        super().__init__(root, manifest, index, frame_lengths, max_open_files)

    def array(self, video: int) -> Any:
        """The memory-mapped ``(frames, max_frame_bytes)`` array of ``video``."""
        path = video_file(self.root, self.keys[video], SUFFIX)
        return self.handles.get(video, lambda: MappedArray(path)).array

    def read(self, video: int, frames: np.ndarray) -> list[bytes]:
        """Copy only the sampled rows out of the map, each cut to its true length."""
        rows = np.asarray(self.array(video)[frames])
        lengths = self.lengths(video)[frames]
        return [row[: int(n)].tobytes() for row, n in zip(rows, lengths)]
