"""The one retry loop: a try repeated after a failure worth another, with exponential backoff
and full jitter, then one error naming the attempts made.

Every remote operation that retries goes through :func:`retried` with the plan of
:data:`packer.remote.storage.RETRY` (requests, uploads, cache downloads, manifests and tables
fetched again after a failed check); the record check of ranged and cached reads
(:func:`packer.remote.reader.check_records`) waits by the same plan between its reads.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Retry", "retried"]

T = TypeVar("T")


@dataclass(frozen=True)
class Retry:
    """How a request that failed for a passing reason is tried again: up to ``attempts`` tries
    in all, waiting a random time in ``[0, min(cap, base * 2**k))`` seconds after the k-th
    failure (exponential backoff, full jitter)."""

    attempts: int = 5
    base: float = 0.2
    cap: float = 5.0

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` failed tries (1 after the first)."""
        return random.uniform(0.0, min(self.cap, self.base * 2 ** (failures - 1)))


def retried(
    plan: Retry,
    try_once: Callable[[int], T],
    retry_on: Callable[[Exception], bool],
    give_up: Callable[[Exception, int, float], BaseException],
) -> T:
    """``try_once(attempt)`` (1, 2, ...) until it returns, up to ``plan.attempts`` tries,
    sleeping ``plan.delay(k)`` after the k-th failure.

    A failure ``retry_on`` refuses is raised at once (``retry_on`` may raise an error of its
    own instead: a denied request, an object replaced since the open). After the last try,
    ``give_up(last exception, attempts, seconds spent)`` is raised from the last exception.
    """
    began = time.monotonic()
    for attempt in range(1, plan.attempts + 1):
        try:
            return try_once(attempt)
        except Exception as exc:
            if not retry_on(exc):
                raise
            if attempt == plan.attempts:
                raise give_up(exc, attempt, time.monotonic() - began) from exc
        time.sleep(plan.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover
