"""HDF5: shards of records in one contiguous ``/data`` each, or one file per video.

Layout ``"shards"`` (images), ``shard-NNNNN.h5``::

    /data      uint8 (planned bytes,), contiguous, allocated up front: records back to back
    /offsets   int64 (n,)  byte offset of each record in /data
    /lengths   int64 (n,)  byte length of each record
    attrs: packer_layout_version, used_bytes (bytes of /data in use)

Layout ``"per-sample"`` (video, the mission's per-video HDF5), ``<class>/<video>.h5``::

    /data      uint8 (total frame bytes,), contiguous: the encoded frames back to back
    /offsets   int64 (frames + 1,): frame j is /data[offsets[j]:offsets[j + 1]]
    attrs: num_frames, key, packer_layout_version

Any HDF5 tool reads these files. packer's writer records each record's *file* offset (the
contiguous /data's offset plus the record's offset in it) in ``records.npy``, so reading needs
no HDF5 call at all: shards are mapped and sliced, per-video files read with ``pread`` (see
``packer.formats.base.FileReader``). No h5py handle is ever open in a reading process, so fork
is safe (h5py#934).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from packer.core.manifest import LAYOUT_VERSION, ShardInfo, shard_name
from packer.errors import InputFileError
from packer.formats.base import FileReader
from packer.formats.writer import WriterBase

__all__ = ["NAME", "Reader", "Writer"]

NAME = "hdf5"
SUFFIXES = (".h5", ".hdf5")
SHARD_SUFFIX = ".h5"
LAYOUTS = ("shards", "per-sample")
OFFSETS = "bytes"  # records.npy offsets are byte offsets in the file
TRANSCODE = None
_FLUSH_BYTES = 32 << 20


def _check_space(root: Path, planned: int) -> None:
    """Refuse to start a shard that cannot fit: the HDF5 library does not survive a full disk
    mid-write (its later clean-up can crash the process), so the space is checked first."""
    need = planned + planned // 100 + (64 << 10)
    free = shutil.disk_usage(root).free
    if free < need:
        raise OSError(errno.ENOSPC, f"{need} bytes needed for the next HDF5 shard, {free} free")


def _h5py() -> ModuleType:
    """h5py, imported by the writer only: a reading process never loads it (no HDF5 library
    state to inherit across a fork), and a process that writes no HDF5 skips its ~50 ms import
    (and the ``uname -p`` it runs)."""
    import h5py

    return h5py


def _early_allocation() -> Any:
    """Dataset-creation properties: storage allocated at creation, so its offset is known."""
    h5py = _h5py()
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return dcpl


def _fsync(path: Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


class Writer(WriterBase):
    """Write records into HDF5 shards, or one file per sample; a context manager."""

    SHARD_SUFFIX = SHARD_SUFFIX

    def _fresh(self) -> None:
        self._file: Any = None
        self._base = 0
        self._buffer = bytearray()
        self._flushed = 0
        self._offsets: list[int] = []
        self._lengths: list[int] = []

    def _discard(self) -> None:
        handle, self._file = self._file, None
        if handle is not None:
            try:
                handle.close()
            except Exception:  # HDF5 cannot flush a file on a full disk; the shard is redone
                pass

    def _open_shard(self, shard: int) -> None:
        _check_space(self.root, self.planned[shard])
        path = self.root / shard_name(shard, SHARD_SUFFIX)
        self._file = _h5py().File(path, "w", libver="v110", track_order=False)
        data = self._file.create_dataset(
            "data",
            shape=(max(self.planned[shard], 1),),
            dtype=np.uint8,
            track_times=False,
            dcpl=_early_allocation(),
        )
        self._base = int(data.id.get_offset())

    def _write_sample(self, key: str, records: Sequence[bytes]) -> list[int]:
        path = self.root / (key + Reader.SAMPLE_SUFFIX)
        path.parent.mkdir(parents=True, exist_ok=True)
        offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum([len(r) for r in records], out=offsets[1:])
        with _h5py().File(path, "w", libver="v110", track_order=False) as fh:
            data = fh.create_dataset(
                "data",
                data=np.frombuffer(b"".join(records), dtype=np.uint8),
                track_times=False,
                dcpl=_early_allocation(),
            )
            base = int(data.id.get_offset())
            fh.create_dataset("offsets", data=offsets, track_times=False)
            fh.attrs["num_frames"] = len(records)
            fh.attrs["key"] = key
            fh.attrs["packer_layout_version"] = LAYOUT_VERSION
        _fsync(path)
        self.files.added(path)
        return (base + offsets[:-1]).tolist()

    def write(self, shard: int, key: str, records: Sequence[bytes]) -> list[int]:
        """Append one sample's records; return each record's byte offset in its file."""
        if self.per_sample:
            return self._write_sample(key, records)
        self._roll(shard)
        room = self.planned[shard] - self._flushed - len(self._buffer)
        if sum(len(r) for r in records) > room:  # the file grew since it was scanned
            raise InputFileError(
                f"changed during the conversion: {sum(len(r) for r in records)} bytes read, more "
                "than scanned; convert it again once it is complete"
            )
        out = []
        for record in records:
            offset = self._flushed + len(self._buffer)
            self._buffer += record
            self._offsets.append(offset)
            self._lengths.append(len(record))
            out.append(self._base + offset)
        if len(self._buffer) >= _FLUSH_BYTES:
            self._flush()
        return out

    def _flush(self) -> None:
        if self._buffer:
            end = self._flushed + len(self._buffer)
            self._file["data"][self._flushed : end] = np.frombuffer(self._buffer, dtype=np.uint8)
            self._flushed = end
            self._buffer = bytearray()

    def finish_shard(self) -> ShardInfo | None:
        """Close the open shard (if any) durably and return its entry; sync per-sample files."""
        if self._file is None:
            self.files.sync_folders()
            return None
        self._flush()
        for name, values in (("offsets", self._offsets), ("lengths", self._lengths)):
            self._file.create_dataset(
                name, data=np.asarray(values, dtype=np.int64), track_times=False
            )
        self._file.attrs["packer_layout_version"] = LAYOUT_VERSION
        self._file.attrs["used_bytes"] = self._flushed
        handle, self._file = self._file, None
        handle.close()
        path = self._shard_path()
        _fsync(path)
        self.files.added(path)
        self.files.sync_folders()
        count = len(self._offsets)
        self._flushed = 0
        self._offsets, self._lengths = [], []
        return self._shard_entry(count)


class Reader(FileReader):
    """Read records from HDF5 files by offset: shards mapped, per-video files by ``pread``."""

    SAMPLE_SUFFIX = ".h5"
