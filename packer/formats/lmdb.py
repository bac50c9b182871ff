"""LMDB: shards ``shard-NNNNN.mdb`` (one file each, ``subdir=False``), one LMDB record per record.

The key is the record's number within its shard as 8 big-endian bytes, so keys are appended in
order and records lie on disk in dataset order; the value is the stored bytes (an image, or one
frame of a video: a video's frames are consecutive records of one shard). ``records.npy`` gives
each record's shard (``file``) and number (``offset``). Only the ``"shards"`` layout exists.

Reading: each process opens each shard once (``readonly=True, lock=False``) and keeps one
long-lived ``buffers=True`` read transaction; a batch or a clip is one ``getmulti`` per shard.
Readahead defaults to on for images (measured: off made cold image reads several times slower
than plain files) and off for video (a clip reads a few frames of a video: readahead would read
the frames around them too).
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packer.errors import FormatError
from packer.formats.base import ReaderBase
from packer.formats.files import Identity, identity, replaced
from packer.manifest import Manifest, ShardInfo, file_checksum, fsync_dir, shard_name

__all__ = ["NAME", "Reader", "Writer", "record_key"]

NAME = "lmdb"
SUFFIXES = (".lmdb",)
SHARD_SUFFIX = ".mdb"
LAYOUTS = ("shards",)
OFFSETS = "records"  # records.npy offsets are record numbers in the shard
TRANSCODE = None
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

    def __init__(
        self, root: Path, planned_shard_bytes: Sequence[int], layout: str, kind: str
    ) -> None:
        self.root = Path(root)
        self.planned = list(planned_shard_bytes)
        self._env: Any = None
        self._txn: Any = None
        self._current = -1
        self._count = 0
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self._abort()

    def _open_shard(self, shard: int) -> None:
        self.finish_shard()
        path = self.root / shard_name(shard, SHARD_SUFFIX)
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

    def write(self, shard: int, key: str, records: Sequence[bytes]) -> list[int]:
        """Append one sample's records to ``shard``; return their record numbers in it."""
        try:
            if shard != self._current:
                self._open_shard(shard)
            first = self._count
            for record in records:
                self._put(record_key(self._count), record)
                self._count += 1
        except lmdb.Error as exc:  # LMDB reports a failed write (e.g. disk full) as EIO
            raise OSError(errno.EIO, f"LMDB write failed: {exc}") from exc
        return list(range(first, self._count))

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
        path = self.root / shard_name(self._current, SHARD_SUFFIX)
        fsync_dir(self.root)
        self._env = self._txn = None
        self._current = -1
        self._pending = []
        self._pending_bytes = 0
        return ShardInfo(path.name, self._count, path.stat().st_size, file_checksum(path))

    def _abort(self) -> None:
        if self._env is not None:
            self._txn.abort()
            self._env.close()
            self._env = self._txn = None


def _libc_madvise() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):  # not a libc with madvise: no prefetch, still correct
        return None
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


_MADVISE = _libc_madvise()
_MADV_WILLNEED = 3


def prefetch(values: list[Any]) -> None:
    """Ask the kernel to read the pages of several mapped records at once (``MADV_WILLNEED``)
    before they are copied one by one: without readahead every page would otherwise be its own
    synchronous read, one after another. Values are ``buffers=True`` views into LMDB's map."""
    if _MADVISE is None:
        return
    for value in values:
        address = np.frombuffer(value, dtype=np.uint8).ctypes.data
        start = address & ~(_PAGE - 1)
        _MADVISE(start, address + len(value) - start, _MADV_WILLNEED)


class _Env:
    """One process's open environment of one shard, shared by every reader of that shard.

    py-lmdb refuses to open the same environment twice in one process, so readers share it
    (reference-counted). Each thread reading it gets its own long-lived ``buffers=True`` read
    transaction and cursor (an LMDB transaction belongs to one thread).
    """

    def __init__(self, path: str, readahead: bool) -> None:
        self.env: Any = None
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
        self.users = 0
        self._local = threading.local()
        self._txns: list[Any] = []
        self._lock = threading.Lock()
        _ALL_ENVS.add(self)

    def forget(self) -> None:
        """In a forked child: drop (never close) the parent's environment, transactions and
        cursors, so py-lmdb forgets them and this process may open the shard itself."""
        self.env = None
        self._txns = []
        self._local = threading.local()

    @property
    def cursor(self) -> Any:
        """This thread's cursor (its read transaction begins on first use)."""
        cursor = getattr(self._local, "cursor", None)
        if cursor is None:
            if self.env is None:
                raise FormatError("an LMDB environment inherited through fork cannot be used")
            txn = self.env.begin(buffers=True)
            with self._lock:
                self._txns.append(txn)
            cursor = self._local.cursor = txn.cursor()
        return cursor

    def close(self) -> None:
        with self._lock:
            for txn in self._txns:
                txn.abort()
            self._txns = []
        if self.env is not None:
            self.env.close()


_ALL_ENVS: weakref.WeakSet[_Env] = weakref.WeakSet()


def _forget_inherited() -> None:
    global _OPEN
    _OPEN = {}
    for shared in list(_ALL_ENVS):
        shared.forget()


os.register_at_fork(after_in_child=_forget_inherited)

_OPEN: dict[tuple[int, int], _Env] = {}
_OPEN_PID = os.getpid()
_OPEN_LOCK = threading.Lock()


class _Handle:
    """A reader's reference to a shared :class:`_Env`; ``close`` releases it.

    Environments are shared by file identity (device, inode), not by path, so a shard replaced
    under the same name is a different environment, never the old one.
    """

    def __init__(self, path: str, readahead: bool, expected: Identity | None) -> None:
        global _OPEN, _OPEN_PID
        try:
            st = os.stat(path)
        except OSError as exc:
            raise FormatError(f"cannot open LMDB shard {path!r}: {exc.strerror}") from exc
        if expected is not None and identity(st) != tuple(expected):
            raise replaced(Path(path))
        key = (st.st_dev, st.st_ino)
        with _OPEN_LOCK:
            if _OPEN_PID != os.getpid():  # forked child: never touch the parent's environments
                _OPEN, _OPEN_PID = {}, os.getpid()
            shared = _OPEN.get(key)
            if shared is None:
                shared = _OPEN[key] = _Env(path, readahead)
            elif shared.readahead != readahead:
                raise FormatError(
                    f"LMDB shard {path!r} is already open in this process with "
                    f"readahead={shared.readahead}; py-lmdb allows one open per process, so "
                    "every reader of it here must use the same readahead setting"
                )
            shared.users += 1
        self._key = key
        self._path = path
        self._shared: _Env | None = shared

    @property
    def cursor(self) -> Any:
        """This thread's cursor on the shard."""
        if self._shared is None:
            raise FormatError(f"LMDB shard {self._path!r} was closed")
        return self._shared.cursor

    def close(self) -> None:
        shared, self._shared = self._shared, None
        if shared is None or _OPEN_PID != os.getpid():
            return
        with _OPEN_LOCK:
            shared.users -= 1
            if shared.users == 0 and _OPEN.get(self._key) is shared:
                del _OPEN[self._key]
                shared.close()


class Reader(ReaderBase):
    """Read records from LMDB shards.

    Args:
        readahead: let the kernel read ahead around each record (default: on for images, off
            for video; see the module docstring).
        max_open_files: the most shards one process keeps open.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        records: np.ndarray,
        readahead: bool | None = None,
        max_open_files: int | None = None,
    ) -> None:
        super().__init__(root, manifest, records, max_open_files)
        self.readahead = manifest.kind != "video" if readahead is None else bool(readahead)

    def _shard(self, shard: int) -> _Handle:
        def opener() -> _Handle:
            path = self.folder().path_of(self.shard_names[shard])
            return _Handle(path, self.readahead, self.shard_id(shard))

        return self.handles.get(shard, opener)

    def _get(self, file: int, starts: list[int]) -> list[tuple[Any, Any]]:
        keys = [n.to_bytes(8, "big") for n in starts]
        try:
            pairs = self._shard(file).cursor.getmulti(keys)
        except lmdb.Error as exc:
            raise FormatError(f"cannot read {self.shard_names[file]!r}: {exc}") from exc
        if len(pairs) != len(keys):
            missing = sorted(set(keys) - {bytes(k) for k, _ in pairs})
            raise FormatError(
                f"record {int.from_bytes(missing[0], 'big')} is missing from "
                f"{self.shard_names[file]!r}"
            )
        return pairs

    def _read_file(self, file: int, starts: list[int], lengths: list[int]) -> list[bytes]:
        pairs = self._get(file, starts)
        if not self.readahead and len(pairs) > 1:
            prefetch([value for _, value in pairs])
        return [bytes(value) for _, value in pairs]

    def _read_file_into(
        self, file: int, starts: list[int], lengths: list[int], out: memoryview, where: list[int]
    ) -> None:
        pairs = self._get(file, starts)
        if not self.readahead and len(pairs) > 1:
            prefetch([value for _, value in pairs])
        for (_, value), w, n in zip(pairs, where, lengths):
            if len(value) != n:
                raise FormatError(f"a record of {self.shard_names[file]!r} has the wrong length")
            out[w : w + n] = value
