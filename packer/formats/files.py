"""Files under the readers and writers: descriptors, maps, positioned reads, durable writes.

Readers of per-sample files (a video's ``.npy``/``.h5``) keep *descriptors*, not maps, in a
bounded per-process cache: a descriptor costs no address space, and a clip reads only its
records' byte ranges with ``pread``/``preadv`` (the kernel is told the access is random, so it
reads no more than the pages asked for). Shard readers map the whole shard once per process.

How a mapped image shard is read from disk (:func:`shard_readahead`): a shuffled epoch reads
every byte of the dataset once, and a page fault of a map reads only one readahead window
around it, waiting for it before the next; so by default, when the image dataset is at most half
the memory available (``MemAvailable``), a shard's whole file is put in flight at its first touch
in each process (``POSIX_FADV_WILLNEED`` window by window: the kernel caps one call at the
device's readahead size). Measured in ``benchmarks/README.md`` ("Shuffled cold reads").
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from pathlib import Path

from packer.core.contained import (
    Identity,
    fstat_identity,
    open_beneath,
    open_folder,
    replaced,
)
from packer.core.manifest import fsync_dir
from packer.errors import FormatError

__all__ = [
    "DurableFiles",
    "Folder",
    "Identity",
    "MappedFile",
    "OpenFile",
    "PAGE",
    "coalesce",
    "identity",
    "read_ranges",
    "read_ranges_into",
    "shard_readahead",
]

PAGE = 4096
WHOLE, KERNEL, EXACT = "whole", "kernel", "exact"
_WINDOW = 8 << 20  # bytes per WILLNEED call when a whole shard is asked for


def coalesce(
    starts: Sequence[int], lengths: Sequence[int], gap: int = 4096
) -> list[tuple[int, int, int, int]]:
    """Group ranges sorted by start into runs read at once: ``(start, stop, first, last+1)``.

    Two ranges join a run when the bytes between them are fewer than ``gap`` (a local file: a
    page, read anyway; a URL: :data:`packer.remote.storage.GAP`, cheaper than another request).
    """
    runs: list[tuple[int, int, int, int]] = []
    for k, (a, n) in enumerate(zip(starts, lengths)):
        if runs and a - runs[-1][1] < gap and a >= runs[-1][0]:
            start, stop, first, _ = runs[-1]
            runs[-1] = (start, max(stop, a + n), first, k + 1)
        else:
            runs.append((a, a + n, k, k + 1))
    return runs


def shard_readahead(
    readahead: bool | None, kind: str, data_bytes: int, available: int | None
) -> str:
    """How mapped shards are read: ``"whole"`` (each shard's file asked for at its first touch),
    ``"kernel"`` (the kernel's readahead window around each fault) or ``"exact"`` (only the
    pages touched: ``MADV_RANDOM``).

    ``readahead=True`` forces ``"whole"``, ``False`` forces ``"exact"``. The default (None):
    ``"whole"`` for images when the dataset's ``data_bytes`` are at most half of ``available``
    memory (a shuffled epoch reads it all anyway, and it stays cached for the next), else
    ``"kernel"``; video is never asked for whole (a clip reads a few frames).
    """
    if readahead is not None:
        return WHOLE if readahead else EXACT
    if kind == "video" or available is None or 2 * data_bytes > available:
        return KERNEL
    return WHOLE


def identity(st: os.stat_result) -> Identity:
    """What identifies a file's content in place: device, inode, size and modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class Folder:
    """One process's descriptor of a dataset folder (a handle-cache entry): every data file is
    opened relative to it (``packer.core.contained``: no link at any level, never a FIFO), so a
    reader never reads a folder that replaced the one it opened, nor anything outside it.

    Args:
        path: the folder.
        expected: its ``(st_dev, st_ino)`` when the dataset was opened, or None.
    """

    def __init__(self, path: Path, expected: tuple[int, int] | None = None) -> None:
        self.path = path
        self.fd = open_folder(path, expected)

    def open(self, name: str, expected: Identity | None = None) -> int:
        """A descriptor of the regular file ``name`` (a plain relative path) under this folder;
        with ``expected``, the very file seen at open time."""
        try:
            fd = open_beneath(self.fd, name, self.path)
        except FormatError:
            if os.fstat(self.fd).st_nlink == 0:  # the folder itself was deleted or replaced
                raise replaced(self.path) from None
            raise
        if expected is not None and fstat_identity(fd) != tuple(expected):
            os.close(fd)
            raise replaced(self.path / name)
        return fd

    def path_of(self, name: str) -> str:
        """A path to ``name`` that resolves through this descriptor (for libraries that only
        take paths, e.g. LMDB), or the plain path where ``/proc`` is missing."""
        pinned = f"/proc/self/fd/{self.fd}"
        return f"{pinned}/{name}" if os.path.isdir(pinned) else str(self.path / name)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class OpenFile:
    """One process's descriptor of one data file (a handle-cache entry).

    Args:
        folder: the dataset folder (a :class:`Folder`), or a plain path's parent if None.
        name: the file's path relative to the folder.
        random: advise the kernel that reads are random (no readahead beyond each read).
        expected: the file's identity when the dataset was opened (shards), or None.
    """

    def __init__(
        self,
        folder: Folder | Path,
        name: str = "",
        random: bool = True,
        expected: Identity | None = None,
    ) -> None:
        if isinstance(folder, Path):  # a plain file, opened on its own
            parent = Folder(folder.parent)
            name = folder.name
            try:
                self.fd = parent.open(name, expected)
            finally:
                parent.close()
        else:
            parent = folder
            self.fd = parent.open(name, expected)
        self.path = parent.path / name
        self.size = os.fstat(self.fd).st_size
        if random and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _cached(fd: int, size: int, probes: int = 16) -> bool:
    """Whether ``probes`` bytes spread over the file are all in the page cache (``preadv`` with
    ``RWF_NOWAIT`` refuses to wait for a disk): asking again for a cached shard's every window
    would cost ~5 ms per 433 MB, ~10 % of a warm shuffled epoch of raw bytes."""
    if not hasattr(os, "RWF_NOWAIT"):
        return False
    probe = bytearray(1)
    try:
        return all(
            os.preadv(fd, [probe], size * k // probes, os.RWF_NOWAIT) == 1 for k in range(probes)
        )
    except OSError:  # BlockingIOError (not cached), or a file system without RWF_NOWAIT
        return False


class MappedFile:
    """One process's read-only map of one whole data file (a handle-cache entry).

    ``readahead`` is a :func:`shard_readahead` decision: ``"whole"`` puts the whole file's
    reads in flight now, ``"exact"`` advises the map random, ``"kernel"`` leaves it alone.
    """

    def __init__(
        self,
        folder: Folder,
        name: str,
        expected: Identity | None = None,
        readahead: str = KERNEL,
    ) -> None:
        fd = folder.open(name, expected)
        try:
            size = os.fstat(fd).st_size
            self.map: mmap.mmap | None = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else None
            if readahead == WHOLE and hasattr(os, "posix_fadvise") and not _cached(fd, size):
                for start in range(0, size, _WINDOW):
                    os.posix_fadvise(fd, start, min(_WINDOW, size - start), os.POSIX_FADV_WILLNEED)
            elif readahead == EXACT and self.map is not None and hasattr(mmap, "MADV_RANDOM"):
                self.map.madvise(mmap.MADV_RANDOM)
        except (OSError, ValueError) as exc:
            raise FormatError(f"cannot map {str(folder.path / name)!r}: {exc}") from exc
        finally:
            os.close(fd)
        self.size = size
        self.view = memoryview(self.map) if self.map is not None else memoryview(b"")

    def close(self) -> None:
        try:
            self.view.release()
            if self.map is not None:
                self.map.close()
        except BufferError:  # a slice is still alive: let GC unmap it
            pass


def _pread(handle: OpenFile, start: int, size: int) -> bytes:
    data = os.pread(handle.fd, size, start)
    if len(data) != size:
        raise FormatError(
            f"{str(handle.path)!r} ends before byte {start + size} (it has {handle.size}): "
            "the file is truncated"
        )
    return data


def _prefetch(handle: OpenFile, runs: list[tuple[int, int, int, int]]) -> None:
    """Put every run's read in flight at once (``POSIX_FADV_WILLNEED``) before the ``pread``s
    that wait for them: a cold clip then costs about one disk round trip, not one per frame.

    Raises:
        FormatError: a run ends past the file (a crafted offset such as 2**63 - 10 would make
            the kernel refuse the call with EINVAL).
    """
    stop = max(run[1] for run in runs) if runs else 0
    if stop > handle.size:
        raise FormatError(
            f"{str(handle.path)!r} ends before byte {stop} (it has {handle.size}): the file is "
            "truncated or the record table damaged"
        )
    if len(runs) > 1 and hasattr(os, "posix_fadvise"):
        for start, stop, _, _ in runs:
            os.posix_fadvise(handle.fd, start, stop - start, os.POSIX_FADV_WILLNEED)


def read_ranges(handle: OpenFile, starts: Sequence[int], lengths: Sequence[int]) -> list[bytes]:
    """The bytes of each range (sorted by start), one ``pread`` per coalesced run."""
    out: list[bytes] = []
    runs = coalesce(starts, lengths)
    _prefetch(handle, runs)
    for start, stop, first, last in runs:
        block = _pread(handle, start, stop - start)
        if last - first == 1 and lengths[first] == len(block):
            out.append(block)
            continue
        view = memoryview(block)
        out += [
            bytes(view[starts[k] - start : starts[k] - start + lengths[k]])
            for k in range(first, last)
        ]
    return out


def read_ranges_into(
    handle: OpenFile,
    starts: Sequence[int],
    lengths: Sequence[int],
    out: memoryview,
    where: Sequence[int],
) -> None:
    """Read each range (sorted by start) straight into ``out[where[k]:where[k]+lengths[k]]``.

    One ``preadv`` per coalesced run: the gaps go to a scratch buffer, the records to ``out``.
    """
    runs = coalesce(starts, lengths)
    _prefetch(handle, runs)
    for start, stop, first, last in runs:
        buffers: list[memoryview | bytearray] = []
        position = start
        for k in range(first, last):
            if starts[k] < position:  # overlapping ranges: fall back to a plain copy
                buffers = []
                break
            if starts[k] > position:
                buffers.append(bytearray(starts[k] - position))
            buffers.append(out[where[k] : where[k] + lengths[k]])
            position = starts[k] + lengths[k]
        if buffers and hasattr(os, "preadv"):
            got = os.preadv(handle.fd, buffers, start)
            if got != position - start:
                raise FormatError(
                    f"{str(handle.path)!r} ends before byte {position} (it has "
                    f"{handle.size}): the file is truncated"
                )
            continue
        block = _pread(handle, start, stop - start)
        for k in range(first, last):
            a = starts[k] - start
            out[where[k] : where[k] + lengths[k]] = block[a : a + lengths[k]]


class DurableFiles:
    """Make files written under ``root`` durable: fsync each file as it is written, and its
    folders (up to ``root``) once per batch."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._folders: set[Path] = set()

    def write(self, path: Path, chunks: Sequence[bytes | memoryview]) -> int:
        """Write ``chunks`` to a new file at ``path``, fsync it; return its size."""
        if path.parent not in self._folders:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._folders.add(path.parent)
        size = 0
        with open(path, "wb") as fh:
            for chunk in chunks:
                size += fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        return size

    def added(self, path: Path) -> None:
        """Note a file written (and fsync'd) by other means, so its folder gets synced."""
        self._folders.add(path.parent)

    def sync_folders(self) -> None:
        """fsync every folder a file went into since the last call, and its parents up to root."""
        folders, self._folders = self._folders, set()
        todo: set[Path] = set()
        for folder in folders:
            while folder not in todo:
                todo.add(folder)
                if folder == self.root or self.root not in folder.parents:
                    break
                folder = folder.parent
        for folder in sorted(todo, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(folder)
