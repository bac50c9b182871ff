"""LMDB shards as this process reads them: environments shared per file, one read transaction
per thread, released with their last reader, forgotten by a forked child (py-lmdb refuses to open
a file again while any object of it lives).

Any number of readers of one shard may live in one process with different ``readahead`` wishes
(a training and a caption-only view of one dataset): the environment is opened once, with the
first opener's setting, and later readers share it. ``readahead`` is only advice to the kernel
(``MDB_NORDAHEAD`` is ``madvise(MADV_RANDOM)`` on the map), so every reader reads the same bytes;
a reader on an environment opened without readahead asks for its batches' pages itself
(:meth:`Handle.prefetch`, see :attr:`Handle.readahead`).
"""

from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import Any

import lmdb

from packer.errors import FormatError
from packer.formats.files import Identity, identity, replaced

__all__ = ["Handle"]


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
_OPEN_LOCK = threading.RLock()  # re-entered when GC finalizes a dropped reader (it closes its handles) while this thread opens one


class Handle:
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
            if shared is None:  # the first opener's readahead serves every later reader
                shared = _OPEN[key] = _Env(path, readahead)
            shared.users += 1
        self._key = key
        self._path = path
        self._shared: _Env | None = shared
        self._fd = -1  # opened on the first prefetch: image readers never need it

    @property
    def readahead(self) -> bool:
        """Whether the shared environment was opened with readahead (the first opener's wish,
        which may differ from this reader's)."""
        return self._shared.readahead if self._shared is not None else False

    def prefetch(self, starts: list[int], lengths: list[int]) -> None:
        """Put the reads of several records' pages in flight at once (``POSIX_FADV_WILLNEED`` at
        the value offsets recorded at conversion) before LMDB touches them page by page: without
        readahead every page would otherwise be its own synchronous read."""
        if hasattr(os, "posix_fadvise"):
            if self._fd < 0:
                self._fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
            for start, length in zip(starts, lengths):
                os.posix_fadvise(self._fd, start, length, os.POSIX_FADV_WILLNEED)

    @property
    def cursor(self) -> Any:
        """This thread's cursor on the shard."""
        if self._shared is None:
            raise FormatError(f"LMDB shard {self._path!r} was closed")
        return self._shared.cursor

    def close(self) -> None:
        shared, self._shared = self._shared, None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if shared is None or _OPEN_PID != os.getpid():
            return
        with _OPEN_LOCK:
            shared.users -= 1
            if shared.users == 0 and _OPEN.get(self._key) is shared:
                del _OPEN[self._key]
                shared.close()
