"""What ``benchmarks/mixture_throughput.py`` measures: one epoch of a :class:`packer.Mixture` of
two packed outputs against one epoch of each output read one after the other, with the same
sampler (:class:`packer.ShardedSampler`) and one ``DataLoader`` each way.

The baseline, :class:`OneAfterOther`, is the least a training loop needs to read two outputs in
one DataLoader: a dataset over both (index ``len(a) + j`` is ``b[j]``) whose ``__getitems__``
passes each source's part of a batch to that source's own ``__getitems__``, and a sampler that
yields ``ShardedSampler(a)``'s epoch, then ``ShardedSampler(b)``'s. Both ways read every sample
of both outputs once per epoch (the mixture's default weights and epoch length), batch by batch
through packer's batch path; what differs is the mixture's work: its layout (computed once per
process per epoch), the lookup of each position, and the two outputs' chunks interleaved.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset, Sampler

import packer
from harness.host_load import host_busy_seconds, others_during, own_usage
from harness.throughput import prewarm, resident_all
from packer.diagnosis.io_counters import read_counters
from packer.diagnosis.targets import close_dataset, data_files, evict_page_cache

__all__ = ["KINDS", "OneAfterOther", "Sequenced", "one_pass"]

KINDS = ("mixture", "one after other")


class OneAfterOther(Dataset):
    """Two datasets as one index space, ``a`` then ``b``, read a batch at a time."""

    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b, self.na = a, b, len(a)

    def __len__(self) -> int:
        return self.na + len(self.b)

    def __getitem__(self, i: int) -> Any:
        return self.a[i] if i < self.na else self.b[i - self.na]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        first = [i for i in indices if i < self.na]
        second = [i - self.na for i in indices if i >= self.na]
        out = self.a.__getitems__(first) if first else []
        return out + (self.b.__getitems__(second) if second else [])


class Sequenced(Sampler[int]):
    """``ShardedSampler(a)``'s epoch, then ``ShardedSampler(b)``'s shifted by ``len(a)``."""

    def __init__(self, a: Any, b: Any, seed: int) -> None:
        self.first = packer.ShardedSampler(a, seed=seed)
        self.second = packer.ShardedSampler(b, seed=seed)
        self.offset = len(a)

    def __len__(self) -> int:
        return len(self.first) + len(self.second)

    def set_epoch(self, epoch: int) -> None:
        self.first.set_epoch(epoch)
        self.second.set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        yield from self.first
        for i in self.second:
            yield i + self.offset


def _keep(batch: list[Any]) -> list[Any]:
    return batch


def one_pass(
    kind: str,
    paths: tuple[Path, Path],
    cache: str,
    mode: str,
    workers: int,
    batch_size: int,
    epochs: int = 1,
) -> dict[str, Any]:
    """``epochs`` epochs of ``kind`` over the two outputs, in this process, the page cache made
    ``cache`` before each (untimed); images per second of the timed epochs, the CPU seconds per
    image and the bytes fetched from storage (``read_bytes``) per epoch of this process and its
    reaped DataLoader workers, the largest share of the CPUs other processes used during an
    epoch, and the resident fraction of the files before the first epoch."""
    a = packer.open_dataset(paths[0], output=mode)
    b = packer.open_dataset(paths[1], output=mode)
    if kind == "mixture":
        dataset: Any = packer.Mixture({"a": a, "b": b}, seed=1)
        sampler: Any = packer.ShardedSampler(dataset, seed=1)  # passes set_epoch on to it
    else:
        dataset, sampler = OneAfterOther(a, b), Sequenced(a, b, seed=1)
    files = data_files(paths[0]) + data_files(paths[1])
    loader = DataLoader(
        dataset, batch_size=batch_size, sampler=sampler, num_workers=workers, collate_fn=_keep
    )
    images, seconds, cpu, disk, others, resident = 0, 0.0, 0.0, 0, [], None
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        if cache == "cold":
            evict_page_cache(files)
        else:
            prewarm(files)
        resident = resident_all(files) if resident is None else resident
        gc.collect()
        cpu_before, disk_before = own_usage()[0], read_counters().read_bytes
        host_before, begun = host_busy_seconds(), time.perf_counter()
        images += sum(len(batch) for batch in loader)
        took, own = time.perf_counter() - begun, own_usage()[0] - cpu_before
        seconds, cpu = seconds + took, cpu + own
        disk += read_counters().read_bytes - disk_before  # reaped workers' reads count here
        others.append(others_during(host_before, host_busy_seconds(), own, took))
    for ds in (a, b):
        close_dataset(ds)
    return {
        "images": images,
        "seconds": seconds,
        "images_per_s": images / seconds,
        "cpu_us_per_image": 1e6 * cpu / images,
        "disk_mb_per_epoch": disk / 1e6 / epochs,
        "others_cpu_share": max((o for o in others if o is not None), default=None),
        "resident_before": resident,
    }
