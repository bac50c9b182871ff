"""What lets a local conversion's stages overlap: shards finished in the background, a heap that
the writers do not hand back to the kernel between commits.

:mod:`packer.write.pipeline` loads samples on a pool (reading, checking and checksumming in the workers
that hold the bytes), writes them in source order on the converting thread, and hands each
complete planned shard to a :class:`ShardFinisher`: the shard's last commit, its fsync, its
checksum and its checkpoint run on one background thread while the next shard is written. The
bytes written do not change: each shard is written by its own writer, exactly as before, and
finished shards are checkpointed in order. ``workers=1`` keeps everything on the calling thread.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType

from packer.core.handles import set_malloc

__all__ = ["ShardFinisher", "keep_heap_for_writes"]

# A writer's freed transaction (LMDB: up to 64 MB of dirty pages a commit) stays in the heap for
# the next one, instead of being trimmed and page-faulted back in (measured: 3-4× less system
# time writing LMDB shards). Values up to 32 MiB (glibc's largest) come from the heap, not from
# a fresh mmap each.
_TRIM_THRESHOLD = 256 << 20
_MMAP_THRESHOLD = 32 << 20


def keep_heap_for_writes() -> bool:
    """Let glibc keep up to 256 MiB of freed heap in this process (``M_TRIM_THRESHOLD``) and
    serve allocations up to 32 MiB from the heap (``M_MMAP_THRESHOLD``), once per process.

    A conversion allocates and frees a shard's worth of buffers per commit; with glibc's
    defaults every commit's free shrinks the heap and the next transaction faults it back in.
    ``PACKER_NO_MALLOPT=1`` leaves malloc alone (as it does for readers). Returns whether the
    settings are in effect."""
    return set_malloc(_TRIM_THRESHOLD, _MMAP_THRESHOLD)


class ShardFinisher:
    """Finish shards one at a time, in the order given, while the caller writes the next one.

    ``submit(finish)`` first waits for the shard finishing before (so at most one shard's
    buffers wait, and its error surfaces), then runs ``finish`` on the background thread (on
    the caller's thread when ``background`` is false). Leaving the ``with`` block waits for the
    last one: nothing is still writing when the caller returns or raises. An error of a finish
    is raised by the next ``submit`` or on leaving; when the caller is already raising, its own
    error wins and the finish's is dropped (the shard was not checkpointed either way).
    """

    def __init__(self, background: bool) -> None:
        self._pool = ThreadPoolExecutor(1, "packer-finish") if background else None
        self._pending: Future[None] | None = None

    def submit(self, finish: Callable[[], None]) -> None:
        self.wait()
        if self._pool is None:
            finish()
        else:
            self._pending = self._pool.submit(finish)

    def wait(self) -> None:
        """Wait for the shard finishing, raising its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def __enter__(self) -> ShardFinisher:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self.wait()
            elif self._pending is not None:
                self._pending.exception()  # wait, and keep the caller's error
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
