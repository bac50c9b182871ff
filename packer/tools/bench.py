"""Measurement functions shared by ``packer demo``, ``packer bench`` and ``benchmarks/``.

They return plain data and never print. :func:`run_bench` times every (path, mode, workers,
cache) configuration through a real DataLoader and records the wait of every batch;
:mod:`packer.tools.storage_cost` counts what each sample costs the storage.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from packer.errors import PackerError
from packer.tools.io_counters import resident_fraction
from packer.tools.stalls import Stall, WaitStats, detect_stall, wait_stats
from packer.tools.targets import (
    MODES,
    bench_collate,
    close_dataset,
    cold_supported,
    data_files,
    evict_page_cache,
    files_for,
    open_for_mode,
    path_labels,
    stored_bytes,
    subset_indices,
)

__all__ = [
    "MODES",
    "BenchSpec",
    "RunResult",
    "Throughput",
    "data_files",
    "evict_page_cache",
    "measure_throughput",
    "median_run",
    "open_for_mode",
    "plan",
    "run_bench",
    "run_config",
    "timed_epoch",
]


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


# --------------------------------------------------------------------------------------------
# packer bench: every (path, mode, workers, cache) through a real DataLoader, per-batch waits


@dataclass
class BenchSpec:
    """The options of a bench run (one value each; lists are swept)."""

    workers: Sequence[int] = (0, 2, 4)
    modes: Sequence[str] = ("bytes",)
    batch_size: int = 64
    epochs: int = 1
    warmup: int = 1
    cold: bool = False
    limit: int | None = None
    shuffle: bool = False
    step_ms: float = 0.0
    multiprocessing_context: str | None = None

    def validate(self) -> None:
        """Raise PackerError on a value out of range."""
        for mode in self.modes:
            if mode not in MODES:
                raise PackerError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        checks = [
            (min(self.workers, default=0) >= 0 and len(self.workers) > 0, "workers", ">= 0"),
            (self.batch_size >= 1, "batch size", ">= 1"),
            (self.epochs >= 1, "epochs", ">= 1"),
            (self.warmup >= 0, "warmup", ">= 0"),
            (self.limit is None or self.limit >= 1, "limit", ">= 1"),
            (self.step_ms >= 0, "step ms", ">= 0"),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise PackerError(f"invalid {name}: expected {expected}")


@dataclass
class RunResult:
    """One configuration's timed epochs: throughput and the wait of every batch."""

    label: str
    path: str
    mode: str
    workers: int
    cache: str
    batch_size: int
    images: int
    bytes: int
    seconds: float
    epoch_seconds: list[float]
    waits: list[float]
    step_ms: float = 0.0
    resident_before: float | None = None
    ratio: float | None = None

    @property
    def images_per_s(self) -> float:
        """Images per second over the timed epochs."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Stored megabytes (10^6) per second."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0

    def waits_summary(self) -> WaitStats:
        """p50 / p95 / max of the per-batch waits."""
        return wait_stats(self.waits)

    def stall(self) -> Stall:
        """The stall pattern in the per-batch waits."""
        return detect_stall(self.waits, skip=max(1, self.workers))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with the derived rates, wait summary and stall."""
        return {
            **asdict(self),
            "images_per_s": self.images_per_s,
            "mb_per_s": self.mb_per_s,
            "wait": self.waits_summary().to_dict(),
            "stall": self.stall().to_dict(),
        }


def _loader(dataset: Dataset, spec: BenchSpec, workers: int, persistent: bool) -> DataLoader:
    return DataLoader(
        dataset,
        batch_size=spec.batch_size,
        shuffle=spec.shuffle,
        num_workers=workers,
        collate_fn=bench_collate,
        persistent_workers=persistent and workers > 0,
        multiprocessing_context=spec.multiprocessing_context if workers > 0 else None,
        generator=torch.Generator().manual_seed(0) if spec.shuffle else None,
    )


def timed_epoch(loader: Iterable[Any], step_s: float = 0.0) -> tuple[float, list[float]]:
    """Iterate once; return the epoch's seconds and each batch's wait (time spent in ``next``).

    The first wait includes creating the iterator (starting the workers). ``step_s`` seconds of
    sleep after each batch stand in for a training step.
    """
    waits = []
    start = before = time.perf_counter()
    it = iter(loader)
    while True:
        try:
            next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - before)
        if step_s > 0:
            time.sleep(step_s)
        before = time.perf_counter()
    del it
    return time.perf_counter() - start, waits


def run_config(
    path: str | os.PathLike[str], label: str, mode: str, workers: int, cache: str, spec: BenchSpec
) -> RunResult:
    """Time ``spec.epochs`` epochs of one configuration on a fresh dataset.

    ``warm``: one loader with persistent workers; ``spec.warmup`` untimed epochs first.
    ``cold``: before every timed epoch a fresh dataset and loader (no process keeps pages
    mapped), the files evicted from the page cache; the epoch includes starting the workers.
    """
    epoch_seconds: list[float] = []
    waits: list[float] = []
    resident: float | None = None
    images = nbytes = 0
    loader: DataLoader | None = None
    for epoch in range(spec.epochs):
        if cache == "cold" or loader is None:
            dataset = open_for_mode(path, mode)
            indices = subset_indices(dataset, spec.limit)
            subset = Subset(dataset, indices) if len(indices) < len(dataset) else dataset  # type: ignore[arg-type]
            loader = _loader(subset, spec, workers, persistent=cache == "warm")
            sample_bytes = stored_bytes(dataset, path, indices)
            files = files_for(dataset, path, indices)
            for _ in range(spec.warmup if cache == "warm" else 0):
                timed_epoch(loader)
        if cache == "cold":
            evict_page_cache(files)
        if epoch == 0:
            resident = resident_fraction(files)
        seconds, epoch_waits = timed_epoch(loader, spec.step_ms / 1e3)
        epoch_seconds.append(seconds)
        waits.extend(epoch_waits)
        images, nbytes = images + len(indices), nbytes + sample_bytes
        if cache == "cold":
            close_dataset(dataset)
            loader = None
    if loader is not None:
        close_dataset(loader.dataset)
        del loader
    return RunResult(
        label, str(path), mode, workers, cache, spec.batch_size, images, nbytes,
        sum(epoch_seconds), epoch_seconds, waits, spec.step_ms, resident,
    )  # fmt: skip


def plan(paths: Sequence[str | os.PathLike[str]], spec: BenchSpec) -> list[tuple[Any, ...]]:
    """Every configuration ``(path, label, mode, workers, cache)`` in run order.

    Paths vary fastest so each (mode, workers, cache) group, baseline first, completes together.
    """
    caches = ["cold"] if spec.cold and cold_supported() else ["warm"]
    labels = path_labels(paths)
    return [
        (path, label, mode, workers, cache)
        for mode in spec.modes
        for workers in spec.workers
        for cache in caches
        for path, label in zip(paths, labels)
    ]


def check_paths(paths: Sequence[str | os.PathLike[str]]) -> None:
    """Open every path once so a bad one fails before any measurement.

    Raises:
        PackerError: a path is missing, or neither a packer output nor an image folder.
    """
    if not paths:
        raise PackerError("no dataset given; pass one or more packer outputs or image folders")
    for path in paths:
        close_dataset(open_for_mode(path, "bytes"))


def run_bench(paths: Sequence[str | os.PathLike[str]], spec: BenchSpec) -> Iterator[RunResult]:
    """Run every configuration of :func:`plan`, yielding each result as it is measured.

    A consumer interrupted with Ctrl-C keeps everything yielded so far. Ratios to the first path
    (the baseline) in the same (mode, workers, cache) are filled in as results arrive.
    """
    spec.validate()
    check_paths(paths)
    baselines: dict[tuple[str, int, str], float] = {}
    for path, label, mode, workers, cache in plan(paths, spec):
        result = run_config(path, label, mode, workers, cache, spec)
        key = (mode, workers, cache)
        if str(path) == str(paths[0]):
            baselines[key] = result.images_per_s
        base = baselines.get(key)
        result.ratio = result.images_per_s / base if base else None
        yield result
