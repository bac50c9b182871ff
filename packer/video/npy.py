"""NPY video layout: one ``<class>/<video>.npy`` per video, frames as zero-padded rows.

Each file is a plain ``.npy`` array of shape ``(frames, max_frame_bytes)``, dtype uint8: row
``j`` holds frame ``j``'s encoded bytes followed by zeros up to the video's largest frame. The
true length of every frame is in ``frames.npy`` (``packer.video.layout``), so decoding never
sees the padding. ``np.load(path, mmap_mode="r")`` opens a file; the reader parses the header
once, memory-maps the file and copies out only the true bytes of the sampled frames. A manifest entry::

    {"format": "npy", "kind": "video", "layout_version": 1, "shards": [],
     "options": {"storage": {"padding_overhead": 1.31, ...}, ...}}
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from packer.errors import FormatError
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

    def array(self, video: int) -> Any:
        """The memory-mapped ``(frames, max_frame_bytes)`` array of ``video``."""
        return np.load(video_file(self.root, self.keys[video], SUFFIX), mmap_mode="r")

    def read(self, video: int, frames: np.ndarray) -> list[bytes]:
        """Copy only the sampled frames' true bytes out of the map (no padding is touched)."""
        path = video_file(self.root, self.keys[video], SUFFIX)
        rows = self.handles.get(video, lambda: PaddedRows(path))
        lengths = self.lengths(video)[frames].tolist()
        starts = (rows.data_offset + np.asarray(frames, dtype=np.int64) * rows.width).tolist()
        return [bytes(rows.view[a : a + n]) for a, n in zip(starts, lengths)]


class PaddedRows:
    """One process's map of one padded ``.npy`` video: the header parsed once, rows sliced."""

    def __init__(self, path: Path) -> None:
        try:
            with open(path, "rb") as fh:
                version = npformat.read_magic(fh)
                read_header = (
                    npformat.read_array_header_1_0
                    if version == (1, 0)
                    else npformat.read_array_header_2_0
                )
                shape, _, dtype = read_header(fh)
                self.data_offset = fh.tell()
                self.map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise FormatError(f"cannot open {str(path)!r}: {exc}") from exc
        if dtype != np.uint8 or len(shape) != 2:
            self.map.close()
            raise FormatError(
                f"{str(path)!r} is not a (frames, bytes) uint8 array: {shape} {dtype}"
            )
        self.width = int(shape[1])
        self.view = memoryview(self.map)

    def close(self) -> None:
        try:
            self.view.release()
            self.map.close()
        except BufferError:  # a slice is still alive: let GC unmap it
            pass
