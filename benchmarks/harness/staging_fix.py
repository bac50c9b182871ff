"""A prototype of the fix ``benchmarks/staging_stream.py`` proposes, measured beside the real
thing and never shipped: :class:`packer.upload_stream.ShardStream` with up to ``INFLIGHT``
shards uploading at once instead of one.

The shipped stream sends one shard, waits for its response (and the size check's HEAD), then
the next: each PUT's fixed costs (the client hashing and signing the body, the round trips,
the server storing it) leave the link idle between bodies. Here the upload thread hands each
queued shard to a small pool as soon as fewer than ``INFLIGHT`` are in flight; the accounting
is the shipped one (a shard leaves the queue, and its bytes the limit, once uploaded and
released), so the staging bound is unchanged. Installed for one run by :func:`installed`
(``packer.staging.ShardStream`` swapped, then restored).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import packer.staging
from packer.upload_stream import ShardStream

INFLIGHT = 4


class ParallelStream(ShardStream):
    """:class:`ShardStream` sending up to :data:`INFLIGHT` queued shards together."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._submitted: set[int] = set()  # id() of the queue entries handed to the pool
        self._pool = ThreadPoolExecutor(INFLIGHT, thread_name_prefix="packer-upload")
        super().__init__(*args, **kwargs)

    def _next(self) -> tuple[Any, ...] | None:
        """The first queued entry not yet handed to the pool, when one more may be sent
        (called holding the condition); None to stop."""
        while True:
            if self._stopped or self._error is not None:
                return None
            fresh = [e for e in self._queue if id(e) not in self._submitted]
            if fresh and len(self._submitted) < INFLIGHT:
                self._submitted.add(id(fresh[0]))
                return fresh[0]
            self._cond.wait()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    entry = self._next()
                if entry is None:
                    return
                future = self._pool.submit(self._send, entry[0])
                future.add_done_callback(lambda f, e=entry: self._done(f, e))
        finally:
            self._pool.shutdown(wait=True)

    def _done(self, future: Future[None], entry: tuple[Any, ...]) -> None:
        with self._cond:
            self._submitted.discard(id(entry))
            error = future.exception()
            if error is not None:
                self._error = self._error or error
            else:
                self._queue.remove(entry)
                self.waiting -= entry[1]
                self.uploaded += len(entry[0])
                self.bytes += entry[1]
            self._cond.notify_all()


@contextmanager
def installed() -> Iterator[None]:
    """``convert_to_url`` streams through :class:`ParallelStream` inside the ``with``."""
    saved = packer.staging.ShardStream
    packer.staging.ShardStream = ParallelStream  # type: ignore[misc]
    try:
        yield
    finally:
        packer.staging.ShardStream = saved  # type: ignore[misc]
