"""What every video writer and reader shares: per-video file paths, runs, the reader's state.

Each video format module (``packer.video.npy``, ``.hdf5``, ``.lmdb``, ``.bmp``) declares
``NAME`` (the core format name), ``SUFFIX``, ``TRANSCODE`` (None, or bytes -> bytes for every
frame), a ``Writer(root, shard_size)`` context manager with ``write(key, label, frames) -> shard``,
``close() -> list[ShardInfo]`` and ``data_bytes``, and a ``Reader`` built on :class:`VideoReaderBase`
with ``read(video, frames) -> list[bytes]`` for sorted, distinct frame numbers of one video.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from packer.handles import HandleCache
from packer.manifest import Manifest, ShardInfo, load_keys
from packer.strings import StringTable

__all__ = ["PerVideoWriter", "VideoReaderBase", "runs", "video_file"]


def video_file(root: Path, key: str, suffix: str) -> Path:
    """The per-video file (or folder, for an empty suffix) of the video with ``key``."""
    return root / (key + suffix)


def runs(frames: np.ndarray) -> list[tuple[int, int]]:
    """Split sorted distinct frame numbers into ``(first, stop)`` runs of consecutive frames."""
    if len(frames) == 0:
        return []
    breaks = np.flatnonzero(np.diff(frames) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(frames)]))
    return [(int(frames[a]), int(frames[b - 1]) + 1) for a, b in zip(starts, stops)]


class PerVideoWriter:
    """What writers of one-file-(or folder)-per-video layouts share; a context manager.

    Subclasses implement ``write(key, label, frames) -> shard`` and add to ``data_bytes``.
    """

    def __init__(self, root: str | os.PathLike[str], shard_size: int = 0) -> None:
        self.root = Path(root)
        self.data_bytes = 0

    def __enter__(self) -> PerVideoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def close(self) -> list[ShardInfo]:
        """Nothing to finish (checksums are in the index)."""
        return []


class VideoReaderBase:
    """Picklable reader state: root, keys, the per-video index columns and frame lengths.

    Args:
        root: the packed dataset directory.
        manifest: its manifest.
        index: its ``index.npy`` rows (one per video).
        frame_lengths: the ``length`` column of ``frames.npy`` (true byte length of each frame).
        max_open_files: the most files (or shards) one process keeps open (least recently used
            closed first).
        close_before_fork: close the open files in the parent before each fork (HDF5).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        index: np.ndarray,
        frame_lengths: np.ndarray,
        max_open_files: int = 128,
        close_before_fork: bool = False,
    ) -> None:
        self.root = Path(root)
        self.keys = StringTable(load_keys(root))
        self.shard_names = [s.name for s in manifest.shards]
        self.shard = np.ascontiguousarray(index["shard"], dtype=np.int32)
        self.first = np.ascontiguousarray(index["offset"], dtype=np.int64)
        self.count = np.ascontiguousarray(index["length"], dtype=np.int64)
        self.frame_lengths = np.ascontiguousarray(frame_lengths, dtype=np.uint32)
        self.handles = HandleCache(capacity=max_open_files, close_before_fork=close_before_fork)

    def __len__(self) -> int:
        return len(self.count)

    def lengths(self, video: int) -> np.ndarray:
        """True byte lengths of every frame of ``video``."""
        first = int(self.first[video])
        return self.frame_lengths[first : first + int(self.count[video])]

    def read(self, video: int, frames: np.ndarray) -> list[bytes]:
        """The stored bytes of frames ``frames`` (sorted, distinct) of ``video``."""
        raise NotImplementedError

    def close(self) -> None:
        """Close this process's open files (they reopen on the next read)."""
        self.handles.close_all()
