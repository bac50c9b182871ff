"""A dataset whose items take a fixed time and no CPU: the num_workers stall, reproduced.

Each item sleeps ``delay`` seconds (storage latency stand-in), so a worker needs
``batch_size × delay`` per batch whatever the machine; workers begin together at ``start_at``
(wall clock), as they effectively do when building a batch takes much longer than forking them.
Used by ``benchmarks/bench_stall.py`` and the tests of :func:`packer.diagnose`.
"""

from __future__ import annotations

import time

from torch.utils.data import Dataset

__all__ = ["SleepyDataset"]


class SleepyDataset(Dataset):
    """``n`` items (their indices), each taking ``delay`` seconds after ``start_at``."""

    def __init__(self, n: int = 400, delay: float = 0.05, start_at: float = 0.0) -> None:
        self.n, self.delay, self.start_at = n, delay, start_at

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(max(0.0, self.start_at - time.time()) + self.delay)
        return i
