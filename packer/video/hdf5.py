"""HDF5 video layout: one ``<class>/<video>.h5`` per video.

Per file::

    /data      uint8 (total frame bytes,), contiguous: the encoded frames back to back
    /offsets   int64 (frames + 1,): frame j is /data[offsets[j]:offsets[j + 1]]
    attrs: label, num_frames, key, packer_layout_version

The reader takes frame offsets from ``frames.npy`` (no /offsets read) and reads each run of
consecutive sampled frames with one slice of the memory-mapped contiguous /data
(``packer.formats.hdf5.ContiguousData``); each process keeps at most ``max_open_files`` maps
(LRU), closed in the parent before a fork.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

from packer.formats.hdf5 import ContiguousData
from packer.manifest import Manifest
from packer.video.common import PerVideoWriter, VideoReaderBase, runs, video_file
from packer.video.layout import LAYOUT_VERSION

__all__ = ["NAME", "Reader", "Writer"]

NAME = "hdf5"
SUFFIX = ".h5"
SHARDED = False
TRANSCODE = None


class Writer(PerVideoWriter):
    """Write one ``.h5`` per video; a context manager."""

    def write(self, key: str, label: int, frames: list[bytes]) -> int:
        """Write one video; return its shard (-1: the video is its own file)."""
        path = video_file(self.root, key, SUFFIX)
        path.parent.mkdir(parents=True, exist_ok=True)
        offsets = np.zeros(len(frames) + 1, dtype=np.int64)
        np.cumsum([len(f) for f in frames], out=offsets[1:])
        data = np.frombuffer(b"".join(frames), dtype=np.uint8)
        with h5py.File(path, "w", libver="v110", track_order=False) as fh:
            fh.create_dataset("data", data=data, track_times=False)
            fh.create_dataset("offsets", data=offsets, track_times=False)
            fh.attrs["label"] = label
            fh.attrs["num_frames"] = len(frames)
            fh.attrs["key"] = key
            fh.attrs["packer_layout_version"] = LAYOUT_VERSION
        self.data_bytes += path.stat().st_size
        return -1


class Reader(VideoReaderBase):
    """Read sampled frames from per-video ``.h5`` files (bounded LRU of open files)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        index: np.ndarray,
        frame_lengths: np.ndarray,
        max_open_files: int = 64,
    ) -> None:
        super().__init__(
            root, manifest, index, frame_lengths, max_open_files, close_before_fork=True
        )

    def read(self, video: int, frames: np.ndarray) -> list[bytes]:
        """One slice per run of consecutive frames, split into frames."""
        path = video_file(self.root, self.keys[video], SUFFIX)
        data = self.handles.get(video, lambda: ContiguousData(path)).view
        offsets = np.zeros(int(self.count[video]) + 1, dtype=np.int64)
        np.cumsum(self.lengths(video), out=offsets[1:])
        out: list[bytes] = []
        for first, stop in runs(frames):
            base = int(offsets[first])
            block = bytes(data[base : int(offsets[stop])])
            out += [
                block[int(offsets[j]) - base : int(offsets[j + 1]) - base]
                for j in range(first, stop)
            ]
        return out
