"""LMDB layout: shards ``shard-NNNNN.mdb`` (one file each, ``subdir=False``), one record per sample.

The record key is the sample's record number within its shard as 8 big-endian bytes, so keys
are appended in order and records lie on disk in dataset order (sequential reads stay sequential);
the value is the encoded image exactly as in the source. ``index.npy`` gives each sample's shard
and record number (``offset`` column). A manifest entry::

    {"format": "lmdb", "layout_version": 1,
     "shards": [{"name": "shard-00000.mdb", "samples": 12000, "bytes": 1074003968, "xxh3_64": "..."}]}

Reading: each process opens each shard once (``readonly=True, lock=False``, readahead on by
default) and keeps one long-lived ``buffers=True`` read transaction; a batch is served with one
``getmulti`` per shard. Measured on image-sized records, readahead off made cold reads several
times slower than plain files, so it is an option (``readahead=False``) and not the default.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packer.errors import FormatError
from packer.formats.common import ReaderBase
from packer.manifest import Manifest, ShardInfo, file_checksum, shard_name

__all__ = ["LAYOUT_VERSION", "NAME", "Reader", "Writer"]

NAME = "lmdb"
LAYOUT_VERSION = 1
SHARDED = True
TRANSCODE = None
SUFFIX = ".mdb"
_PAGE = 4096
_TXN_RECORDS = 1024  # commit a write transaction every this many records ...
_TXN_BYTES = 64 << 20  # ... or this many bytes, whichever comes first (deterministic)


def record_key(position: int) -> bytes:
    """The LMDB key of the sample at ``position``."""
    return position.to_bytes(8, "big")


def initial_map_size(planned_bytes: int) -> int:
    """The map size a shard starts with; it doubles on ``MapFullError``."""
    # Records above ~2 KB go to overflow pages: at most one extra page each, plus B-tree pages.
    return planned_bytes + planned_bytes // 2 + (16 << 20)


class Writer:
    """Write samples into LMDB shards, in order; a context manager."""

    def __init__(self, root: str | os.PathLike[str], planned_shard_bytes: Sequence[int]) -> None:
        self.root = Path(root)
        self.planned = list(planned_shard_bytes)
        self.shards: list[ShardInfo] = []
        self._env: Any = None
        self._txn: Any = None
        self._current = -1
        self._count = 0
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._abort()

    def _open_shard(self, shard: int) -> None:
        self.finish_shard()
        path = self.root / shard_name(shard, SUFFIX)
        self._env = lmdb.open(
            str(path),
            subdir=False,
            lock=False,
            map_size=initial_map_size(self.planned[shard]),
            sync=False,
            metasync=False,
            readahead=False,
            meminit=True,
        )
        self._txn = self._env.begin(write=True)
        self._current = shard
        self._count = 0

    def write(self, shard: int, key: str, label: int, data: bytes) -> tuple[int, int]:
        """Append one sample to ``shard``; return its (record number in the shard, length)."""
        try:
            if shard != self._current:
                self._open_shard(shard)
            record = self._count
            self._put(record_key(record), data)
        except lmdb.Error as exc:  # LMDB reports a failed write (e.g. disk full) as EIO
            raise OSError(errno.EIO, f"LMDB write failed: {exc}") from exc
        self._count += 1
        return record, len(data)

    def _put(self, key: bytes, data: bytes) -> None:
        self._pending.append((key, data))
        self._pending_bytes += len(data)
        try:
            self._txn.put(key, data, append=True)
        except lmdb.MapFullError:
            self._grow_and_replay()
        if len(self._pending) >= _TXN_RECORDS or self._pending_bytes >= _TXN_BYTES:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._pending = []
            self._pending_bytes = 0

    def _grow_and_replay(self) -> None:
        """Double the map size and redo the open transaction's records (kept in memory)."""
        while True:
            self._txn.abort()
            self._env.set_mapsize(self._env.info()["map_size"] * 2)
            self._txn = self._env.begin(write=True)
            try:
                for key, value in self._pending:
                    self._txn.put(key, value, append=True)
                return
            except lmdb.MapFullError:
                continue

    def finish_shard(self) -> ShardInfo | None:
        """Close the open shard (if any), fsync it and return its manifest entry."""
        if self._env is None:
            return None
        try:
            self._txn.commit()
            self._env.sync(True)
        except lmdb.Error as exc:
            raise OSError(errno.EIO, f"LMDB commit failed: {exc}") from exc
        self._env.close()
        path = self.root / shard_name(self._current, SUFFIX)
        self.shards.append(
            ShardInfo(path.name, self._count, path.stat().st_size, file_checksum(path))
        )
        self._env = self._txn = None
        self._pending = []
        self._pending_bytes = 0
        return self.shards[-1]

    def _abort(self) -> None:
        if self._env is not None:
            self._txn.abort()
            self._env.close()
            self._env = self._txn = None

    def close(self) -> list[ShardInfo]:
        """Commit and close the last shard; return every shard's entry."""
        self.finish_shard()
        return self.shards


class _Env:
    """One process's open environment of one shard, shared by every reader of that shard.

    py-lmdb refuses to open the same environment twice in one process, so readers share it
    (reference-counted) along with one long-lived ``buffers=True`` read transaction.
    """

    def __init__(self, path: str, readahead: bool) -> None:
        try:
            self.env = lmdb.open(
                path,
                subdir=False,
                readonly=True,
                lock=False,
                readahead=readahead,
                max_readers=1,
                max_spare_txns=1,
            )
        except lmdb.Error as exc:
            raise FormatError(f"cannot open LMDB shard {path!r}: {exc}") from exc
        self.readahead = readahead
        self.txn = self.env.begin(buffers=True)
        self.cursor = self.txn.cursor()
        self.users = 0


_OPEN: dict[str, _Env] = {}
_OPEN_PID = os.getpid()
_OPEN_LOCK = threading.Lock()


class _Handle:
    """A reader's reference to a shared :class:`_Env`; ``close`` releases it."""

    def __init__(self, path: Path, readahead: bool) -> None:
        global _OPEN, _OPEN_PID
        key = os.path.realpath(path)
        with _OPEN_LOCK:
            if _OPEN_PID != os.getpid():  # forked child: never touch the parent's environments
                _OPEN, _OPEN_PID = {}, os.getpid()
            shared = _OPEN.get(key)
            if shared is None:
                shared = _OPEN[key] = _Env(key, readahead)
            elif shared.readahead != readahead:
                raise FormatError(
                    f"LMDB shard {key!r} is already open in this process with "
                    f"readahead={shared.readahead}; py-lmdb allows one open per process, so "
                    "every reader of it here must use the same readahead setting"
                )
            shared.users += 1
        self._key = key
        self._shared: _Env | None = shared
        self.txn = shared.txn
        self.cursor = shared.cursor

    def close(self) -> None:
        shared, self._shared = self._shared, None
        if shared is None or _OPEN_PID != os.getpid():
            return
        with _OPEN_LOCK:
            shared.users -= 1
            if shared.users == 0 and _OPEN.get(self._key) is shared:
                del _OPEN[self._key]
                shared.txn.abort()
                shared.env.close()


class Reader(ReaderBase):
    """Read samples' bytes from LMDB shards.

    Args:
        readahead: let the kernel read ahead around each record (default True: the measured
            winner for image-sized records; False suits huge random-access datasets on SSD).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        index: np.ndarray,
        readahead: bool = True,
    ) -> None:
        super().__init__(root, manifest, index)
        self.readahead = readahead

    def _shard(self, shard: int) -> _Handle:
        path = self.root / self.shard_names[shard]
        return self.handles.get(shard, lambda: _Handle(path, self.readahead))

    def read(self, i: int) -> bytes:
        """The stored bytes of sample ``i``."""
        value = self._shard(int(self.shard[i])).txn.get(record_key(int(self.offset[i])))
        if value is None:
            raise FormatError(f"sample {i} is missing from {self.shard_names[self.shard[i]]!r}")
        return bytes(value)

    def read_many(self, indices: Sequence[int]) -> list[bytes]:
        """Several samples with one ``getmulti`` per shard, keys in on-disk order."""
        out: list[bytes] = [b""] * len(indices)
        idx = np.asarray(indices, dtype=np.int64)
        shards = self.shard[idx]
        groups = [shards[0]] if len(idx) and (shards == shards[0]).all() else np.unique(shards)
        for shard in groups:
            where = np.arange(len(idx)) if len(groups) == 1 else np.flatnonzero(shards == shard)
            records = self.offset[idx[where]]
            order = np.argsort(records, kind="stable")
            keys = [n.to_bytes(8, "big") for n in records[order].tolist()]
            pairs = self._shard(int(shard)).cursor.getmulti(keys)
            if len(pairs) != len(keys):
                missing = sorted(set(keys) - {bytes(k) for k, _ in pairs})
                raise FormatError(
                    f"record {int.from_bytes(missing[0], 'big')} is missing from "
                    f"{self.shard_names[int(shard)]!r}"
                )
            for j, (_, value) in zip(where[order].tolist(), pairs):
                out[j] = bytes(value)
        return out
