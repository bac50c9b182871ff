"""What reading costs the storage, from the kernel's own counters of the reading process.

- ``/proc/<pid>/io``: ``syscr`` (read syscalls), ``rchar`` (bytes returned by them) and
  ``read_bytes`` (bytes the process made the storage layer fetch: page-cache misses);
- ``/proc/<pid>/stat``: ``majflt``, major page faults, which is how memory-mapped reads
  (LMDB, NPY) reach the disk without any read syscall;
- files opened: Python-level opens (the ``open`` audit event) plus file descriptors that C
  libraries (LMDB, HDF5) opened and kept during the read.

:class:`MeteredDataset` takes these readings inside whichever process reads a batch (a DataLoader
worker or the main process) right before and after the read, so they count that read only.
Page-cache residency is checked with ``mincore`` (Linux), which shows an eviction took effect.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

__all__ = [
    "IOCounters",
    "MeteredBatch",
    "MeteredDataset",
    "io_available",
    "process_threads",
    "read_counters",
    "resident_fraction",
]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class IOCounters:
    """Counters of one process, or the difference of two readings."""

    syscr: int = 0
    rchar: int = 0
    read_bytes: int = 0
    majflt: int = 0
    opens: int = 0

    def __add__(self, other: IOCounters) -> IOCounters:
        return IOCounters(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: IOCounters) -> IOCounters:
        return IOCounters(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))

    def to_dict(self) -> dict[str, int]:
        """Plain dict."""
        return asdict(self)


def io_available() -> bool:
    """Whether ``/proc/self/io`` can be read here (Linux with task IO accounting)."""
    try:
        read_counters()
    except OSError:
        return False
    return True


def read_counters(pid: int | str = "self") -> IOCounters:
    """Read ``syscr``, ``rchar``, ``read_bytes`` and ``majflt`` of a process (``opens`` is 0).

    Raises:
        OSError: the process is gone or its counters are not readable.
    """
    with open(f"/proc/{pid}/io", "rb") as fh:
        io_text = fh.read().decode()
    with open(f"/proc/{pid}/stat", "rb") as fh:
        stat = fh.read().decode().rsplit(")", 1)[1].split()
    values = dict(line.split(": ") for line in io_text.splitlines() if ": " in line)
    return IOCounters(
        syscr=int(values["syscr"]),
        rchar=int(values["rchar"]),
        read_bytes=int(values["read_bytes"]),
        majflt=int(stat[9]),  # field 12 of /proc/<pid>/stat; 2 fields precede ")"
    )


def process_threads(pid: int | str = "self") -> int | None:
    """OS threads of a process (``Threads:`` in ``/proc/<pid>/status``); None if unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh.read().decode().splitlines():
                if line.startswith("Threads:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# --------------------------------------------------------------------------------------------
# Counting opens: the audit hook (Python-level opens) + new file descriptors (C-level opens)

_OPENS: dict[str, Any] = {"pid": None, "active": False, "paths": []}


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _OPENS["active"]:
        _OPENS["paths"].append(str(args[0]) if args else "")


def _install_hook() -> None:
    if _OPENS["pid"] is None:  # hooks are inherited by forked children and cannot be removed
        sys.addaudithook(_audit)
    _OPENS["pid"] = os.getpid()


def _file_fds() -> dict[int, str]:
    """Open descriptors of this process that point at regular files, with their targets."""
    out: dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("/") and not target.startswith(("/proc/", "/dev/")):
            out[int(name)] = target
    return out


def _overhead() -> IOCounters:
    """What two back-to-back readings cost, to subtract from every metered read."""
    first = read_counters()
    return read_counters() - first


class MeteredBatch(list):
    """A batch of samples plus the counters and seconds of the read that produced it."""

    counters: IOCounters
    seconds: float


class MeteredDataset(Dataset):
    """Wrap a dataset so each batch carries the IO counters of reading it, in the reading process.

    Use with ``DataLoader(..., collate_fn=metered_collate)`` (or any collate that keeps the
    :class:`MeteredBatch`); ``len`` and indexing are the wrapped dataset's.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset
        self._overhead: IOCounters | None = None
        self._pid: int | None = None

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> MeteredBatch:
        if self._pid != os.getpid():
            _install_hook()
            self._overhead, self._pid = _overhead(), os.getpid()
        getitems = getattr(self.dataset, "__getitems__", None)
        fds, start_paths = _file_fds(), len(_OPENS["paths"])
        before, start = read_counters(), time.perf_counter()
        _OPENS["active"] = True
        try:
            samples = getitems(list(indices)) if getitems else [self.dataset[i] for i in indices]
        finally:
            _OPENS["active"] = False
        seconds = time.perf_counter() - start
        counters = read_counters() - before - self._overhead  # type: ignore[operator]
        opened = set(_OPENS["paths"][start_paths:])
        del _OPENS["paths"][start_paths:]
        kept = {fd: t for fd, t in _file_fds().items() if fds.get(fd) != t and t not in opened}
        counters.opens = len(opened) + len(kept)
        counters.syscr = max(0, counters.syscr)
        counters.rchar = max(0, counters.rchar)
        batch = MeteredBatch(samples)
        batch.counters, batch.seconds = counters, seconds
        return batch


def metered_collate(batch: Any) -> Any:
    """Collate for :class:`MeteredDataset`: keep the batch (and its counters) as it is."""
    return batch


# --------------------------------------------------------------------------------------------
# Page-cache residency (mincore)


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc


_LIBC = _libc()


def _resident_pages(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    size = os.path.getsize(path)
    if size == 0:
        return 0, 0
    pages = (size + _PAGE - 1) // _PAGE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = _LIBC.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _LIBC.mincore(ctypes.c_void_p(addr), size, vec) != 0:
                return None
            return sum(b & 1 for b in vec), pages
        finally:
            _LIBC.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)


def resident_fraction(
    paths: Iterable[str | os.PathLike[str]], max_files: int = 256
) -> float | None:
    """Fraction of the files' pages in the page cache, over at most ``max_files`` spread files.

    Returns None where ``mincore`` is not available (not Linux).
    """
    if _LIBC is None:
        return None
    files = [Path(p) for p in paths]
    if len(files) > max_files:
        step = len(files) / max_files
        files = [files[int(i * step)] for i in range(max_files)]
    resident = total = 0
    for path in files:
        counts = _resident_pages(path)
        if counts is None:
            return None
        resident, total = resident + counts[0], total + counts[1]
    return resident / total if total else 1.0
