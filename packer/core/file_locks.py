"""Locks through files only (``flock``): taken on the file a path names now, released by
closing, never left behind by a crash (a lock dies with its process), and never kept by a forked
child. The shard cache (``packer.remote.cache``) coordinates every process of a node with them.

A cache folder may be writable by others (a shared scratch disk): every file in it is opened
with no link followed (``O_NOFOLLOW``), created only with ``O_EXCL``, and used only when
``fstat`` shows a regular file of this user with one link (:func:`open_own`): a planted link,
hard link, FIFO or another user's file is refused, never written through."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import weakref
from pathlib import Path

from packer.errors import PackerError

__all__ = ["CacheEntry", "UnsafeCacheFile", "lock", "open_own", "own_file", "release"]
__all__ += ["finished", "unlink_quietly", "write_new"]

_NO_LINK = os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)


class UnsafeCacheFile(PackerError):
    """A file in the cache folder is a link, not a regular file, or not this user's."""


def _unsafe(path: Path, why: str) -> UnsafeCacheFile:
    return UnsafeCacheFile(
        f"refusing the shard cache's file {str(path)!r}: it is {why}. A cache file must be a "
        f"regular file of this user (uid {os.geteuid()}) with one link; it is never followed "
        "or written through. Remove it (packer cache clear), and keep the cache in a folder "
        "only you can write to (cache_dir=, --cache-dir, $PACKER_CACHE_DIR)"
    )


def own_file(st: os.stat_result) -> str | None:
    """Why a cache file with this ``stat`` may not be used, or None: a regular file of this
    user with one link (no other name can reach what is written to it)."""
    if not stat.S_ISREG(st.st_mode):
        return "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_nlink != 1:
        return f"a file with {st.st_nlink} links (a hard link to another file?)"
    return None


def open_own(path: Path, flags: int = os.O_RDONLY, create: bool = False) -> int:
    """A descriptor of ``path``: created with ``O_EXCL`` when ``create`` and absent, else the
    existing file, opened with no link followed and checked by :func:`own_file`.

    Raises:
        UnsafeCacheFile: ``path`` is a link, a folder, a FIFO, another user's file or a file
            with several links.
        FileNotFoundError: ``path`` is absent (and not ``create``).
    """
    while True:
        if create:
            try:
                fd = os.open(path, flags | _NO_LINK | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                pass
            else:
                os.set_blocking(fd, True)
                return fd
        try:
            fd = os.open(path, flags | _NO_LINK)
        except FileNotFoundError:
            if create:
                continue  # removed between the two opens: create it
            raise
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                found = os.stat(path, follow_symlinks=False)
                raise _unsafe(path, own_file(found) or "not a regular file") from None
            raise
        found = os.fstat(fd)
        if found.st_nlink == 0:  # unlinked since the open (a finished download's part): gone,
            os.close(fd)  # not planted (a planted hard link has two links)
            if create:
                continue
            raise FileNotFoundError(errno.ENOENT, "removed as it was opened", str(path))
        why = own_file(found)
        if why is not None:
            os.close(fd)
            raise _unsafe(path, why)
        os.set_blocking(fd, True)
        return fd


def lock(path: Path, how: int, create: bool = True) -> int | None:
    """A descriptor of ``path`` holding the ``flock`` ``how``, or None when ``LOCK_NB`` found it
    taken (or, without ``create``, the file gone). The lock is on the file the path names
    *now*: one unlinked by its holder while this process waited is dropped and the new one
    locked. Opened by :func:`open_own` (no link followed, a regular file of this user)."""
    while True:
        try:
            fd = open_own(path, os.O_RDWR, create)
        except FileNotFoundError:
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
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            _HELD.add(fd)
            return fd
        os.close(fd)
        if not create:
            return None


def finished(data: Path, size: int, bad: tuple[int, int] | None = None) -> os.stat_result | None:
    """The ``lstat`` of the cache's object ``data`` if it is a finished one: a regular file of
    this user with one link (:func:`own_file`: never a link) of ``size`` bytes, and not the
    copy ``bad`` ``(st_dev, st_ino)`` found corrupt; else None."""
    try:
        st = data.lstat()
    except FileNotFoundError:
        return None
    if st.st_size != size or own_file(st) is not None or (st.st_dev, st.st_ino) == bad:
        return None
    return st


def write_new(path: Path, data: bytes) -> None:
    """``path`` written anew: whatever was there (a link too) unlinked, then created with
    ``O_EXCL`` (a link planted meanwhile is refused, never written through)."""
    unlink_quietly(path)
    fd = open_own(path, os.O_WRONLY, create=True)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


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


def release_at_exit() -> None:
    """At this process's exit: every cache object it holds is released (then they may be
    evicted); the cache ends its downloads first (``packer.remote.downloads.end_downloads``)."""
    for entry in list(_LIVE):
        entry.close()


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
    """One object of the cache, held open: its file, its identity ``(st_dev, st_ino)`` when
    checked, and the shared lock that keeps it from eviction until :meth:`close`."""

    def __init__(self, path: Path, fd: int, identity: tuple[int, int]) -> None:
        self.path = path
        self.identity = identity
        self._fd = fd
        _LIVE.add(self)

    def open_data(self) -> int:
        """A read-only descriptor of the held object: no link followed (:func:`open_own`),
        and the very file the cache checked (device and inode)."""
        fd = open_own(self.path)
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self.identity:
            os.close(fd)
            raise UnsafeCacheFile(f"{str(self.path)!r} was replaced while held; read it again")
        return fd

    def close(self) -> None:
        """Release the object (never ``LOCK_UN``: a forked copy must not free the parent's)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            release(fd)

    def __del__(self) -> None:
        self.close()
