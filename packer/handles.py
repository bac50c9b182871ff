"""The one per-process rule for file handles.

A reader holds a :class:`HandleCache`. Handles open on first use *in each process* (the cache
remembers ``os.getpid()`` and starts empty in a forked child), the cache keeps at most
``capacity`` of them open (least recently used closed first), and pickling drops them all, so a
dataset travels to spawn/forkserver workers as paths and options only.

HDF5 keeps a library-level cache of open files that a forked child inherits even when it
reopens the path (h5py#934). Caches made with ``close_before_fork=True`` are therefore closed in
the parent right before every ``fork`` and reopened lazily afterwards.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["HandleCache"]

_FORK_SENSITIVE: weakref.WeakSet[HandleCache] = weakref.WeakSet()


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
        close_before_fork: close every handle in the parent before ``os.fork`` (HDF5).
    """

    def __init__(self, capacity: int = 64, close_before_fork: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.close_before_fork = close_before_fork
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._handles: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        if self.close_before_fork:
            _FORK_SENSITIVE.add(self)

    def get(self, key: Any, opener: Callable[[], Any]) -> Any:
        """Return the handle for ``key`` in this process, opening it with ``opener()`` if needed."""
        if self._pid != os.getpid():
            # A forked child: the parent's handles are not ours to use (nor to close).
            self._reset()
        with self._lock:
            handle = self._handles.get(key)
            if handle is not None:
                self._handles.move_to_end(key)
                return handle
            handle = opener()
            self._handles[key] = handle
            while len(self._handles) > self.capacity:
                _, old = self._handles.popitem(last=False)
                _close(old)
            return handle

    def close_all(self) -> None:
        """Close every handle this process opened."""
        if self._pid != os.getpid():
            self._reset()
            return
        with self._lock:
            while self._handles:
                _, handle = self._handles.popitem(last=False)
                _close(handle)

    def __len__(self) -> int:
        return len(self._handles) if self._pid == os.getpid() else 0

    def __getstate__(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "close_before_fork": self.close_before_fork}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.capacity = state["capacity"]
        self.close_before_fork = state["close_before_fork"]
        self._reset()


def _before_fork() -> None:
    for cache in list(_FORK_SENSITIVE):
        if cache._pid == os.getpid():
            cache.close_all()


os.register_at_fork(before=_before_fork)
