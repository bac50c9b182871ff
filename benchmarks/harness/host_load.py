"""Is the machine quiet? CPU time of this process and of everyone else, for fair timings.

On a shared machine another job's burst can halve a timed pass. These read ``/proc/stat`` and
``getrusage`` so a benchmark can wait for quiet and record how busy the others were.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

__all__ = [
    "OTHERS_WINDOW",
    "QuietWaiter",
    "host_busy_seconds",
    "others_during",
    "others_share",
    "own_usage",
]


def host_busy_seconds() -> float | None:
    """CPU seconds all processes of the machine have run (``/proc/stat``); None off Linux."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


OTHERS_WINDOW = 0.2


def others_share(window: float = OTHERS_WINDOW) -> float | None:
    """Share of the machine's CPUs busy over ``window`` seconds while this process sleeps."""
    before = host_busy_seconds()
    if before is None:
        return None
    cpu_before = own_usage()[0]
    time.sleep(window)
    busy = (host_busy_seconds() or before) - before - (own_usage()[0] - cpu_before)
    return max(0.0, busy) / (window * (os.cpu_count() or 1))


class QuietWaiter:
    """Before a pass, wait (within a total budget) until other processes leave the CPUs alone.

    On a shared machine another job's burst can halve a pass's throughput. Waiting until the
    other processes' CPU share drops under ``threshold`` keeps most passes clean; the budget
    bounds the run time, and each pass still records the share it actually saw.
    """

    def __init__(self, threshold: float, budget: float) -> None:
        self.threshold = threshold
        self.budget = budget
        self.waited = 0.0

    def wait(self) -> float:
        """Seconds waited before this pass, beyond the one check every pass makes."""
        share = others_share()
        start = time.perf_counter()
        while share is not None and share > self.threshold and self.waited < self.budget:
            share = others_share()
            self.waited += OTHERS_WINDOW
        return time.perf_counter() - start


def own_usage() -> tuple[float, int]:
    """CPU seconds and minor page faults of this process and its reaped children (workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return cpu, me.ru_minflt + kids.ru_minflt


def others_during(
    host_before: float | None, host_after: float | None, own_cpu: float, seconds: float
) -> float | None:
    """Share of the machine's CPUs other processes used over ``seconds`` of a measurement.

    None off Linux, or when ``seconds`` is under 0.2: ``/proc/stat`` counts in 10 ms ticks.
    """
    if host_before is None or host_after is None or seconds < 0.2:
        return None
    busy = host_after - host_before
    return max(0.0, busy - own_cpu) / (seconds * (os.cpu_count() or 1))


def add_quiet_options(parser: Any, below: float = 0.15, budget: float = 60.0) -> None:
    """``--quiet-below`` and ``--wait-budget``: how a benchmark waits for a quieter machine
    before each pass (read by :class:`QuietWaiter`)."""
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=below,
        help="before each pass wait until other processes use less than this share of the CPUs",
    )
    parser.add_argument(
        "--wait-budget",
        type=float,
        default=budget,
        help="total seconds the run may spend waiting for a quiet machine (0: never wait)",
    )
