"""HDF5 layout: shards ``shard-NNNNN.h5``; each holds the encoded samples in one flat uint8 dataset.

Per shard file::

    /data      uint8 (planned bytes,), contiguous: encoded samples back to back
    /offsets   int64 (n,)  byte offset of each sample in /data
    /lengths   int64 (n,)  byte length of each sample
    /labels    int64 (n,)  class label of each sample
    attrs: packer_layout_version, used_bytes (bytes of /data in use; the tail is unused
           when a planned input was skipped)

``index.npy`` repeats shard/offset/length for all samples, so readers need not touch /offsets.
A manifest entry::

    {"format": "hdf5", "layout_version": 1,
     "shards": [{"name": "shard-00000.h5", "samples": 12000, "bytes": 1073745920, "xxh3_64": "..."}]}

Reading: /data is contiguous and unfiltered, so each process opens a shard with h5py only to
read the data's file offset, closes it, and memory-maps the file: a sample is a slice, with no
HDF5 call per sample and no h5py handle for a fork to inherit (h5py#934). Open maps are still
closed in the parent before a fork (``packer.handles``); other layouts fall back to h5py.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from packer.errors import FormatError
from packer.formats.common import SliceReader
from packer.handles import HandleCache
from packer.manifest import Manifest, ShardInfo, file_checksum, shard_name

__all__ = ["ContiguousData", "LAYOUT_VERSION", "NAME", "Reader", "Writer"]

NAME = "hdf5"
LAYOUT_VERSION = 1
SHARDED = True
TRANSCODE = None
SUFFIX = ".h5"
_FLUSH_BYTES = 32 << 20


def _check_space(root: Path, planned: int) -> None:
    """Refuse to start a shard that cannot fit: the HDF5 library does not survive a full disk
    mid-write (its later clean-up can crash the process), so the space is checked first."""
    need = planned + planned // 100 + (64 << 10)
    free = shutil.disk_usage(root).free
    if free < need:
        raise OSError(errno.ENOSPC, f"{need} bytes needed for the next HDF5 shard, {free} free")


class Writer:
    """Write samples into HDF5 shards, in order; a context manager."""

    def __init__(self, root: str | os.PathLike[str], planned_shard_bytes: Sequence[int]) -> None:
        self.root = Path(root)
        self.planned = list(planned_shard_bytes)
        self.shards: list[ShardInfo] = []
        self._file: Any = None
        self._current = -1
        self._buffer = bytearray()
        self._flushed = 0
        self._offsets: list[int] = []
        self._lengths: list[int] = []
        self._labels: list[int] = []

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._abort()

    def _abort(self) -> None:
        """Drop the open shard after a failure (e.g. disk full), never raising from here."""
        handle, self._file = self._file, None
        if handle is not None:
            try:
                handle.close()
            except Exception:  # HDF5 cannot flush a file on a full disk; the shard is redone
                pass

    def write(self, shard: int, key: str, label: int, data: bytes) -> tuple[int, int]:
        """Append one sample to ``shard``; return its (byte offset in /data, length)."""
        if shard != self._current:
            self.finish_shard()
            path = self.root / shard_name(shard, SUFFIX)
            _check_space(self.root, self.planned[shard])
            self._file = h5py.File(path, "w", libver="v110", track_order=False)
            self._file.create_dataset(
                "data", shape=(max(self.planned[shard], 1),), dtype=np.uint8, track_times=False
            )
            self._current = shard
        offset = self._flushed + len(self._buffer)
        self._buffer += data
        self._offsets.append(offset)
        self._lengths.append(len(data))
        self._labels.append(label)
        if len(self._buffer) >= _FLUSH_BYTES:
            self._flush()
        return offset, len(data)

    def _flush(self) -> None:
        if self._buffer:
            end = self._flushed + len(self._buffer)
            self._file["data"][self._flushed : end] = np.frombuffer(self._buffer, dtype=np.uint8)
            self._flushed = end
            self._buffer = bytearray()

    def finish_shard(self) -> ShardInfo | None:
        """Close the open shard (if any), fsync it and return its manifest entry."""
        if self._file is None:
            return None
        self._flush()
        columns = (("offsets", self._offsets), ("lengths", self._lengths), ("labels", self._labels))
        for name, values in columns:
            self._file.create_dataset(
                name, data=np.asarray(values, dtype=np.int64), track_times=False
            )
        self._file.attrs["packer_layout_version"] = LAYOUT_VERSION
        self._file.attrs["used_bytes"] = self._flushed
        handle, self._file = self._file, None
        try:
            handle.close()
        except Exception:
            self._file = handle
            self._abort()
            raise
        path = self.root / shard_name(self._current, SUFFIX)
        with open(path, "rb+") as fh:  # durable before the shard is checkpointed
            os.fsync(fh.fileno())
        self.shards.append(
            ShardInfo(path.name, len(self._offsets), path.stat().st_size, file_checksum(path))
        )
        self._flushed = 0
        self._offsets, self._lengths, self._labels = [], [], []
        return self.shards[-1]

    def close(self) -> list[ShardInfo]:
        """Finish the last shard; return every shard's entry."""
        self.finish_shard()
        return self.shards


class ContiguousData:
    """One process's view of one file's /data (a shard here, a video in ``packer.video``).

    /data is written contiguous and unfiltered, so its bytes sit at one offset of the file
    (``get_offset``): the shard is memory-mapped and sliced directly, and h5py is closed again
    right after reading that offset. Any other layout falls back to h5py slicing.
    """

    def __init__(self, path: Path) -> None:
        self.file: Any = None
        self.map: mmap.mmap | None = None
        try:
            handle = h5py.File(path, "r")
            data = handle["data"]
            start = data.id.get_offset()
            size = data.id.get_storage_size()
        except (OSError, KeyError) as exc:
            raise FormatError(f"cannot open HDF5 file {str(path)!r}: {exc}") from exc
        if start is None or data.compression is not None or data.chunks is not None:
            self.file, self.view = handle, data  # slicing goes through h5py
            return
        handle.close()
        with open(path, "rb") as fh:
            self.map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        self.view = memoryview(self.map)[start : start + size]

    def close(self) -> None:
        if self.map is not None:
            try:
                self.view.release()
                self.map.close()
            except BufferError:  # a slice is still alive: let GC unmap it
                pass
        if self.file is not None:
            self.file.close()


class Reader(SliceReader):
    """Read samples' bytes from HDF5 shards (the contiguous /data of each, memory-mapped)."""

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest, index: np.ndarray) -> None:
        super().__init__(root, manifest, index, HandleCache(capacity=256, close_before_fork=True))

    def _view(self, shard: int) -> Any:
        path = self.root / self.shard_names[shard]
        return self.handles.get(shard, lambda: ContiguousData(path)).view
