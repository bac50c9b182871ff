"""A URL dataset's opened state, pickled small: its arrays in one node-local file, mapped back.

A dataset opened at a URL holds what it fetched at open (tables, keys, the reader's record
arrays). Pickled for a DataLoader worker, those arrays would travel through the worker's start-up
pipe, and a worker opening the URL again would fetch them again (each epoch, with
``persistent_workers=False``). Instead :func:`spill` pickles the state with protocol 5 and
writes its out-of-band buffers (every numpy array) into one file under
``packer_home()/tables``, named by the xxh3 of its bytes (written once, by a rename, whatever
the number of workers and epochs). What travels is the pickle without the arrays (the reader's
options stay in it, never on the disk) and the file's path, size and digest. :func:`load`
maps the file (copy on write: shared pages, writable arrays), checks its xxh3 and size, and
unpickles the state over the mapped buffers; a file missing or different (another machine, a
cleaned cache) gives ``None``, and the caller opens the URL again.

Files unused for :data:`KEEP_DAYS` days are removed when a new one is written.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import pickle
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import xxhash

from packer.core.cpus import packer_home

__all__ = ["KEEP_DAYS", "Spilled", "load", "spill", "spill_dir"]

KEEP_DAYS = 7
_ALIGN = 64  # each buffer starts at a multiple of this (numpy's preferred alignment)


class Spilled(NamedTuple):
    """A state whose arrays lie in the file ``path`` (``size`` bytes, xxh3 ``digest``), at
    ``spans`` (start, stop) in the order the pickle ``inband`` takes them."""

    inband: bytes
    path: str
    size: int
    digest: str
    spans: tuple[tuple[int, int], ...]


def spill_dir() -> Path:
    """Where the spilled arrays lie: ``packer_home()/tables``."""
    return packer_home() / "tables"


def _layout(buffers: list[memoryview]) -> tuple[tuple[tuple[int, int], ...], int, str]:
    spans, at, digest = [], 0, xxhash.xxh3_64()
    for view in buffers:
        pad = -at % _ALIGN
        digest.update(b"\0" * pad)
        at += pad
        digest.update(view)
        spans.append((at, at + view.nbytes))
        at += view.nbytes
    return tuple(spans), at, digest.hexdigest()


class _OutOfBand(pickle.Pickler):
    """Protocol 5 with every array's bytes out of band: a strided view (a column of a record
    table) or a subclass (a memmap) as a plain contiguous array. (``bytes`` stay in band: a
    pickler's override never sees them; the readers keep their tables as arrays.)"""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, np.ndarray) and not obj.dtype.hasobject:
            if type(obj) is not np.ndarray or not obj.flags.c_contiguous:
                return np.ascontiguousarray(obj).view(np.ndarray).__reduce_ex__(5)
        return NotImplemented


def spill(state: Any) -> Spilled | None:
    """``state`` pickled with its arrays written to (or found in) the spill folder; None when
    the folder cannot be written (the caller pickles the state whole)."""
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    _OutOfBand(out, protocol=5, buffer_callback=buffers.append).dump(state)
    inband = out.getvalue()
    views = [b.raw() for b in buffers]
    spans, size, digest = _layout(views)
    name = f"{digest}-{size}.bin"
    folder = spill_dir()
    path = folder / name
    try:
        if _found(path, size):
            os.utime(path)  # in use: kept
        else:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            _write(path, views, spans)
            _sweep(folder)
    except OSError:
        return None
    return Spilled(inband, str(path.absolute()), size, digest, spans)


def load(spilled: Spilled) -> Any | None:
    """The state :func:`spill` pickled, its arrays mapped from the spill file (checked); None
    when the file is missing, of another size or holds other bytes."""
    try:
        fd = os.open(spilled.path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size != spilled.size:
            return None
        mapped = mmap.mmap(fd, spilled.size, access=mmap.ACCESS_COPY) if spilled.size else b""
    except OSError:
        return None
    finally:
        os.close(fd)
    view = memoryview(mapped)
    if xxhash.xxh3_64_hexdigest(view) != spilled.digest:
        return None
    return pickle.loads(spilled.inband, buffers=[view[a:b] for a, b in spilled.spans])


def _found(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _write(path: Path, views: list[memoryview], spans: tuple[tuple[int, int], ...]) -> None:
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    ends = (0, *(stop for _, stop in spans))
    try:
        with os.fdopen(fd, "wb") as out:  # each buffer after the padding to its start
            for view, (start, _), end in zip(views, spans, ends):
                out.write(b"\0" * (start - end))
                out.write(view)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise
    os.rename(part, path)  # whole or absent: a reader checks its digest anyway


def _sweep(folder: Path) -> None:
    """Remove the spill files (and leftover parts) unused for :data:`KEEP_DAYS` days."""
    old = time.time() - KEEP_DAYS * 86400
    for entry in folder.iterdir():
        with contextlib.suppress(OSError):
            if entry.lstat().st_mtime < old:
                entry.unlink()
