"""The one per-process rule for file handles.

A reader holds a :class:`HandleCache`. Handles open on first use *in each process* (the cache
remembers ``os.getpid()`` and starts empty in a forked child), the cache keeps at most
``capacity`` of them open (least recently used closed first), and pickling drops them all, so a
dataset travels to spawn/forkserver workers as paths and options only. (No reader holds an
h5py handle, so nothing has to close before a ``fork``: ``packer.formats.hdf5``, h5py#934.)
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["HandleCache", "keep_freed_heap", "set_malloc"]

_TRIM_THRESHOLD = 64 << 20
_MMAP_THRESHOLD = 32 << 20  # glibc's largest allowed value on 64-bit


def keep_freed_heap(trim: int = _TRIM_THRESHOLD) -> bool:
    """Let glibc keep up to 64 MiB of freed heap in this process instead of returning it at once.

    Readers hand out ~100 KB ``bytes`` per sample; with glibc's default 128 KiB trim threshold
    every freed batch shrinks the heap and the next batch page-faults it back in, which costs
    about as much as copying the bytes. Raising ``M_TRIM_THRESHOLD`` removes that (measured in
    ``benchmarks/``). Setting it also freezes glibc's *dynamic* mmap threshold at 128 KiB, so
    ``M_MMAP_THRESHOLD`` is raised with it (to 32 MiB): otherwise every multi-MB batch buffer
    would be a fresh ``mmap`` whose pages fault in one by one (measured: 20 faults and ~67 µs
    per image). Done once per process on the first handle a reader opens; set
    ``PACKER_NO_MALLOPT=1`` to leave malloc alone. Returns whether the settings were applied.
    """
    return set_malloc(trim, _MMAP_THRESHOLD)


_SET: dict[tuple[int, int, int], bool] = {}  # (process id, trim, mmap): in effect


def set_malloc(trim: int, mmap: int) -> bool:
    """glibc's ``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD`` in this process, tried once per
    process and setting (``PACKER_NO_MALLOPT=1``, or a libc that is not glibc: nothing);
    whether they are in effect."""
    key = (os.getpid(), trim, mmap)
    if key not in _SET:
        _SET[key] = _mallopt(trim, mmap)
    return _SET[key]


def _mallopt(trim: int, mmap: int) -> bool:
    if os.environ.get("PACKER_NO_MALLOPT") or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-1, trim) and libc.mallopt(-3, mmap))  # M_TRIM, M_MMAP
    except (OSError, AttributeError):  # not glibc (musl, ...)
        return False


def _close(handle: Any) -> None:
    close = getattr(handle, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # a handle that fails to close must not break the caller
            pass


class HandleCache:
    """Per-process, bounded LRU cache of open file handles.

    Args:
        capacity: the most handles kept open at once in one process.
    """

    def __init__(self, capacity: int = 64) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._handles: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.RLock()  # an opener may itself get a handle (the folder)
        # The handles close when the cache goes (its dataset was dropped), not at process exit:
        # shared LMDB environments are released and descriptors never pile up.
        weakref.finalize(self, _close_remaining, self._handles, self._pid).atexit = False

    def get(self, key: Any, opener: Callable[[], Any]) -> Any:
        """Return the handle for ``key`` in this process, opening it with ``opener()`` if needed."""
        if self._pid != os.getpid():
            self._forget_parent()
        with self._lock:
            handle = self._handles.get(key)
            if handle is not None:
                self._handles.move_to_end(key)
                return handle
            keep_freed_heap()
            handle = opener()
            self._handles[key] = handle
            while len(self._handles) > self.capacity:
                _, old = self._handles.popitem(last=False)
                _close(old)
            return handle

    def holds(self, key: Any) -> bool:
        """Whether this process has the handle for ``key`` open."""
        if self._pid != os.getpid():
            self._forget_parent()
        with self._lock:
            return key in self._handles

    def pop(self, key: Any) -> Any:
        """Take the handle for ``key`` out of this process's cache, or None; the caller closes
        it (a shard's cached copy found corrupt is opened anew)."""
        if self._pid != os.getpid():
            self._forget_parent()
        with self._lock:
            return self._handles.pop(key, None)

    def _forget_parent(self) -> None:
        """In a forked child: drop the parent's handles without closing them (they are the
        parent's to close), so the child's copies of those objects are freed — py-lmdb forgets
        an environment only when its object goes, and refuses to open it again until then."""
        inherited = self._handles
        self._reset()
        inherited.clear()

    def close_all(self) -> None:
        """Close every handle this process opened."""
        if self._pid != os.getpid():
            self._forget_parent()
            return
        with self._lock:
            while self._handles:
                _, handle = self._handles.popitem(last=False)
                _close(handle)

    def __len__(self) -> int:
        return len(self._handles) if self._pid == os.getpid() else 0

    def values(self) -> list[Any]:
        """The handles open in this process."""
        return list(self._handles.values()) if self._pid == os.getpid() else []

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self.capacity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.capacity = state["capacity"]
        self._reset()


def _close_remaining(handles: OrderedDict[Any, Any], pid: int) -> None:
    if os.getpid() != pid:  # a forked child's copy of the parent's handles: not ours
        return
    while handles:
        _, handle = handles.popitem(last=False)
        _close(handle)
