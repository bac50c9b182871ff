"""Measurement functions shared by ``packer demo``/``packer bench`` and ``benchmarks/``.

They return plain data and never print.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Dataset

from packer.manifest import MANIFEST_NAME, load_manifest
from packer.sources import scan

__all__ = ["Throughput", "data_files", "evict_page_cache", "measure_throughput", "median_run"]


@dataclass
class Throughput:
    """One timed pass over a dataset through a DataLoader."""

    images: int
    bytes: int
    seconds: float

    @property
    def images_per_s(self) -> float:
        """Images per second."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Megabytes (10^6) of stored data per second."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, float]:
        """Plain dict, derived rates included."""
        return {**asdict(self), "images_per_s": self.images_per_s, "mb_per_s": self.mb_per_s}


def data_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files holding a dataset's data: a packer output's shards/files, or a folder's images."""
    root = Path(path)
    if (root / MANIFEST_NAME).is_file():
        manifest = load_manifest(root)
        if manifest.shards:
            return [root / s.name for s in manifest.shards]
        return sorted(p for p in root.rglob("*") if p.is_file())
    return [Path(s.path) for s in scan(root).samples]


def evict_page_cache(paths: Iterable[str | os.PathLike[str]]) -> int:
    """Drop the files' pages from the page cache (``POSIX_FADV_DONTNEED`` after ``sync``).

    Returns the number of files evicted; 0 where ``posix_fadvise`` does not exist.
    """
    if not hasattr(os, "posix_fadvise"):
        return 0
    os.sync()
    count = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    return count


def _size_of(item: Any) -> int:
    if isinstance(item, (bytes, bytearray, memoryview)):
        return len(item)
    nbytes = getattr(item, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    if hasattr(item, "numel"):
        return int(item.numel() * item.element_size())
    return 0


def measure_throughput(
    dataset: Dataset,
    num_workers: int = 0,
    batch_size: int = 64,
    collate_fn: Callable[[Any], Any] | None = None,
    shuffle: bool = False,
    multiprocessing_context: str | None = None,
) -> Throughput:
    """Time one full pass over ``dataset`` through a real DataLoader (worker start-up included)."""
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_fn if collate_fn is not None else _list_collate,
        shuffle=shuffle,
        multiprocessing_context=multiprocessing_context if num_workers > 0 else None,
    )
    images = nbytes = 0
    start = time.perf_counter()
    for batch in loader:
        if isinstance(batch, list):
            images += len(batch)
            nbytes += sum(_size_of(item[0]) for item in batch)
        else:  # collate_bytes: (data, offsets, labels)
            images += len(batch[-1])
            nbytes += _size_of(batch[0])
    return Throughput(images, nbytes, time.perf_counter() - start)


def _list_collate(batch: Sequence[Any]) -> list[Any]:
    return list(batch)


def median_run(runs: Sequence[Throughput]) -> Throughput:
    """The run with the median time of several."""
    ordered = sorted(runs, key=lambda r: r.seconds)
    return (
        ordered[len(ordered) // 2]
        if len(ordered) % 2
        else min(
            ordered, key=lambda r: abs(r.seconds - statistics.median(x.seconds for x in ordered))
        )
    )
