"""How many CPUs this process may use: the one count every pool and every recommendation starts from."""

from __future__ import annotations

import os

__all__ = ["available_cpus"]


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and ``taskset`` narrow),
    else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
