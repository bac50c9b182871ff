"""This process's background downloads (the shard cache's prefetches): a few daemon threads per
process (a forked child starts its own), work keyed so one object is fetched once, cancelled as a
whole when a read fails (:func:`cancel_downloads`; a running download stops at its next chunk,
:func:`cancelled`), and waited for at a clean exit (:func:`end_downloads`)."""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = [
    "PREFETCH_THREADS",
    "background",
    "cancel_downloads",
    "cancelled",
    "end_downloads",
    "in_background",
    "wait_for_downloads",
]

PREFETCH_THREADS = 4  # background downloads in flight per process
_FETCH_LOCK = threading.Lock()
_JOB = threading.local()  # .job: (pool, generation) of the work a prefetch thread runs


class _Pool:
    """This process's background downloads: work waiting, work in hand (its key: done when
    set), the threads running, and the generation :func:`cancel_downloads` moves on."""

    def __init__(self) -> None:
        self.waiting: deque[tuple[str, Callable[[], None], int]] = deque()
        self.fetching: dict[str, threading.Event] = {}
        self.threads = 0
        self.generation = 0


_BACKGROUND: dict[int, _Pool] = {}  # by pid: a forked child starts its own


def in_background(key: str, work: Callable[[], None]) -> bool:
    """Run ``work`` (a cache download) on this process's prefetch threads unless the work of
    ``key`` is in hand already; whether it started. Its failure is dropped: the read that needs
    the object reports it. The threads are daemons: the process never waits for them at exit
    (:func:`cancel_downloads` drops the work waiting; a running download stops at its next
    chunk, :func:`cancelled`)."""
    with _FETCH_LOCK:
        pool = _BACKGROUND.get(os.getpid())
        if pool is None:
            pool = _BACKGROUND[os.getpid()] = _Pool()
            # a multiprocessing child (a DataLoader worker) runs no atexit hook: its finalizers
            multiprocessing.util.Finalize(None, end_downloads, exitpriority=1)
        if key in pool.fetching:
            return False
        pool.fetching[key] = threading.Event()
        pool.waiting.append((key, work, pool.generation))
        if pool.threads < PREFETCH_THREADS:
            pool.threads += 1
            thread = threading.Thread(
                target=_serve, args=(pool,), name="packer-prefetch", daemon=True
            )
            thread.start()
    return True


def _serve(pool: _Pool) -> None:
    """A prefetch thread: the waiting work, one at a time, until none is left."""
    while True:
        with _FETCH_LOCK:
            if not pool.waiting:
                pool.threads -= 1
                return
            key, work, generation = pool.waiting.popleft()
        _JOB.job = (pool, generation)
        try:
            if generation == pool.generation:
                work()
        except Exception:  # noqa: S110 - the read that needs the object reports it
            pass
        finally:
            _JOB.job = None
            with _FETCH_LOCK:
                done = pool.fetching.pop(key, None)
            if done is not None:
                done.set()


def background() -> bool:
    """Whether this thread runs a background download (:func:`in_background`)."""
    return getattr(_JOB, "job", None) is not None


def cancelled() -> bool:
    """Whether this thread runs a background download cancelled since it started
    (:func:`cancel_downloads`): it should stop at its next chunk."""
    job = getattr(_JOB, "job", None)
    return job is not None and job[1] != job[0].generation


def cancel_downloads() -> int:
    """Cancel this process's background downloads: the work waiting is dropped, the running
    ones stop at their next chunk or retry (:func:`cancelled`), and the process's exit does
    not wait for them; how many were waiting. Run by a read that failed (the rest would too,
    and the error must not wait for them)."""
    with _FETCH_LOCK:
        pool = _BACKGROUND.get(os.getpid())
        if pool is None:
            return 0
        pool.generation += 1
        dropped = [pool.fetching.pop(key, None) for key, _, _ in pool.waiting]
        pool.waiting.clear()
    for done in dropped:
        if done is not None:
            done.set()
    return len(dropped)


def wait_for_downloads(timeout: float | None = None) -> bool:
    """Wait for this process's background downloads to end; whether all did in time."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _FETCH_LOCK:
            pool = _BACKGROUND.get(os.getpid())
            pending = list(pool.fetching.values()) if pool is not None else []
        if not pending:
            return True
        for done in pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not done.wait(left):
                return False


def end_downloads() -> None:
    """At a clean exit the downloads under way end first (the cache keeps them); after a
    failed read cancelled them (:func:`cancel_downloads`), the process does not wait. Run at
    exit by ``atexit`` and, in a multiprocessing child (which runs no ``atexit`` hook), by its
    finalizers."""
    with _FETCH_LOCK:
        pool = _BACKGROUND.get(os.getpid())
        waits = pool is not None and pool.generation == 0
    if waits:
        wait_for_downloads()


atexit.register(end_downloads)


def _fresh_lock_in_child() -> None:
    global _FETCH_LOCK
    _FETCH_LOCK = threading.Lock()  # a parent's thread may have held it at the fork


os.register_at_fork(after_in_child=_fresh_lock_in_child)
