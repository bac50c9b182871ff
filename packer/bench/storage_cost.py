"""What each sample costs the storage: kernel counters of the process that reads it.

Reads a dataset's samples in bytes mode in one DataLoader worker, normally right after evicting
its files from the page cache, with :class:`packer.diagnosis.io_counters.MeteredDataset` reading
``/proc/self/io`` and ``/proc/self/stat`` around every batch inside that worker. For a video
dataset a sample is a clip: its disk bytes (``read_bytes``) stand next to its payload, the
stored bytes of the frames the clip samples (:func:`packer.diagnosis.targets.payload_bytes`).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, Subset

from packer.diagnosis.io_counters import (
    IOCounters,
    MeteredDataset,
    io_available,
    metered_collate,
    resident_fraction,
)
from packer.diagnosis.targets import (
    cold_supported,
    evict_page_cache,
    files_for,
    open_for_mode,
    payload_bytes,
    stored_bytes,
    subset_indices,
)
from packer.errors import PackerError

__all__ = ["StorageCost", "measure_storage"]


@dataclass
class StorageCost:
    """Kernel counters of the process that read ``samples`` samples (bytes mode), per sample."""

    label: str
    path: str
    samples: int
    stored_bytes: int
    counters: IOCounters
    cold: bool
    resident_before: float | None
    seconds: float
    payload_bytes: int = 0
    unit: str = "sample"

    def per_sample(self) -> dict[str, float]:
        """Files opened, read syscalls, storage (disk) bytes, major faults, stored bytes and
        payload bytes per sample (a clip, for video), and disk bytes per payload byte."""
        n = max(1, self.samples)
        c = self.counters
        return {
            "opens": c.opens / n,
            "read_syscalls": c.syscr / n,
            "storage_bytes": c.read_bytes / n,
            "major_faults": c.majflt / n,
            "stored_bytes": self.stored_bytes / n,
            "payload_bytes": self.payload_bytes / n,
            "disk_per_payload": c.read_bytes / self.payload_bytes if self.payload_bytes else 0.0,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with the per-sample figures."""
        return {**asdict(self), "per_sample": self.per_sample()}


def measure_storage(
    path: str | os.PathLike[str],
    label: str | None = None,
    limit: int | None = None,
    batch_size: int = 64,
    cold: bool = True,
) -> StorageCost:
    """Read the first ``limit`` samples (bytes mode) in one DataLoader worker, cold by default,
    and return the kernel's counters for that worker's reads.

    Raises:
        PackerError: the path is not a dataset, or ``/proc/<pid>/io`` is not readable here.
    """
    if not io_available():
        raise PackerError("per-sample IO counters need Linux /proc/<pid>/io, not readable here")
    dataset = open_for_mode(path, "bytes")
    indices = subset_indices(dataset, limit)
    files = files_for(dataset, path, indices)
    cold = cold and cold_supported()
    if cold:
        evict_page_cache(files)
    resident = resident_fraction(files)
    metered = MeteredDataset(Subset(dataset, indices))
    loader = DataLoader(metered, batch_size=batch_size, num_workers=1, collate_fn=metered_collate)
    total, seconds = IOCounters(), 0.0
    for batch in loader:
        total, seconds = total + batch.counters, seconds + batch.seconds
    return StorageCost(
        label or Path(path).name, str(path), len(indices),
        stored_bytes(dataset, path, indices), total, cold, resident, seconds,
        payload_bytes(dataset, path, indices),
        "clip" if hasattr(dataset, "clip_indices") else "sample",
    )  # fmt: skip
