"""A warning, once per process, for a dataset at a URL read without the shard cache in a
scattered order (``DataLoader(shuffle=True)``): each sample then costs a ranged GET of its own,
where :class:`packer.ShardedSampler` reads runs of consecutive samples in one GET and the cache
reads each shard once (measured in the issue: 430 s for 5,000 images shuffled against 36 s with
``ShardedSampler`` and 9 s through the cache).

A read "jumps" when its sample is not the one after the previous read's. Over each window of
:data:`WINDOW` reads, more than :data:`JUMPY` of them jumping is a scattered order (in order:
none; ``ShardedSampler``'s runs of 16: about 1 in 16; a shuffle: nearly all).
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["JUMPY", "WINDOW", "OrderWatch", "advice"]

WINDOW = 128
JUMPY = 0.5


def advice(url: str) -> str:
    """What the warning (and ``packer doctor URL``) says."""
    return (
        f"{url}: samples are read in a scattered order (shuffle=True?) without the shard cache: "
        "each one is a ranged GET of its own, tens of times slower than reading runs. Use "
        "sampler=packer.ShardedSampler(dataset, shuffle=True) (runs of consecutive samples, one "
        "GET each), or open_dataset(url, cache_dir='/local/ssd/packer-cache') to download each "
        "shard once"
    )


class OrderWatch:
    """Counts the jumps of one process's reads; warns once if they are mostly jumps."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.last = -2
        self.reads = 0
        self.jumps = 0
        self.warned = False

    def see(self, positions: np.ndarray) -> None:
        """Note the positions read (in the order read)."""
        if self.warned or not len(positions):
            return
        steps = np.diff(positions, prepend=self.last)
        self.jumps += int(np.count_nonzero(steps != 1))
        self.reads += len(positions)
        self.last = int(positions[-1])
        if self.reads < WINDOW:
            return
        if self.jumps > JUMPY * self.reads:
            self.warned = True
            warnings.warn(advice(self.url), UserWarning, stacklevel=4)
        self.reads = self.jumps = 0
