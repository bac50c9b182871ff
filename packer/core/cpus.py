"""What this machine gives a process: the CPUs it may use (the one count every pool and every
recommendation starts from), the memory available, and packer's own folder on it."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["available_cpus", "memory_available", "packer_home"]


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and ``taskset`` narrow),
    else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def memory_available() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` in bytes; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def packer_home() -> Path:
    """packer's folder on this machine, parent of the shard cache and of upload staging:
    ``$PACKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/packer``, else ``~/.cache/packer`` (``~``
    expanded in each)."""
    if os.environ.get("PACKER_CACHE_DIR"):
        return Path(os.environ["PACKER_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "packer"
