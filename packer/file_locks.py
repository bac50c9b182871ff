"""Locks through files only (``flock``): taken on the file a path names now, released by
closing, never left behind by a crash (a lock dies with its process), and never kept by a forked
child. The shard cache (``packer.cache``) coordinates every process of a node with them."""

from __future__ import annotations

import fcntl
import os
import weakref
from pathlib import Path

__all__ = ["CacheEntry", "lock", "release", "unlink_quietly"]


def lock(path: Path, how: int, create: bool = True) -> int | None:
    """A descriptor of ``path`` holding the ``flock`` ``how``, or None when ``LOCK_NB`` found it
    taken (or, without ``create``, the file gone). The lock is on the file the path names
    *now*: one unlinked by its holder while this process waited is dropped and the new one
    locked."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if create else 0), 0o644)
        except FileNotFoundError:
            if create:
                raise
            return None
        try:
            fcntl.flock(fd, how)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            _HELD.add(fd)
            return fd
        os.close(fd)
        if not create:
            return None


def unlink_quietly(*paths: Path) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def release(fd: int) -> None:
    """Close a descriptor :func:`lock` gave (its lock goes with it)."""
    _HELD.discard(fd)
    os.close(fd)


_HELD: set[int] = set()  # this process's lock descriptors
_LIVE: weakref.WeakSet[CacheEntry] = weakref.WeakSet()


def _drop_inherited() -> None:
    """In a forked child: close the parent's lock descriptors, so no lock outlives the
    parent's release of it in a child (a ``flock`` belongs to the open file, shared by both:
    the parent keeps its locks, and waiters are not kept waiting by a DataLoader worker)."""
    for entry in list(_LIVE):
        entry._fd = -1  # the number may be reused in the child: never close it again
    for fd in list(_HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_inherited)


class CacheEntry:
    """One object of the cache, held open: its file, and the shared lock that keeps it from
    eviction until :meth:`close`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd
        _LIVE.add(self)

    def close(self) -> None:
        """Release the object (never ``LOCK_UN``: a forked copy must not free the parent's)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            release(fd)

    def __del__(self) -> None:
        self.close()
