"""``packer bench``: every (path, mode, workers, cache) through a real DataLoader.

Returns plain data and never prints. :func:`run_bench` times each configuration with
:func:`packer.diagnosis.timing.time_batches` and records the wait of every batch;
:mod:`packer.bench.storage_cost` counts what each sample costs the storage.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from packer.diagnosis.io_counters import resident_fraction
from packer.diagnosis.stalls import Stall, WaitStats, detect_stall, wait_stats
from packer.diagnosis.targets import (
    MODES,
    bench_collate,
    close_dataset,
    cold_supported,
    evict_page_cache,
    files_for,
    open_for_mode,
    path_labels,
    payload_bytes,
    subset_indices,
)
from packer.diagnosis.timing import Rates, time_batches
from packer.errors import PackerError

__all__ = ["BenchSpec", "RunResult", "check_paths", "plan", "run_bench", "run_config"]


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
    decoder: str = "auto"
    storage_options: dict[str, Any] | None = None  # for URL datasets (fsspec options)

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
class RunResult(Rates):
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
            dataset = open_for_mode(path, mode, spec.decoder, spec.storage_options)
            indices = subset_indices(dataset, spec.limit)
            subset = Subset(dataset, indices) if len(indices) < len(dataset) else dataset  # type: ignore[arg-type]
            loader = _loader(subset, spec, workers, persistent=cache == "warm")
            sample_bytes = payload_bytes(dataset, path, indices)
            files = files_for(dataset, path, indices)
            for _ in range(spec.warmup if cache == "warm" else 0):
                time_batches(loader)
        if cache == "cold":
            evict_page_cache(files)
        if epoch == 0:
            resident = resident_fraction(files)
        timing = time_batches(loader, step_s=spec.step_ms / 1e3)
        epoch_seconds.append(timing.seconds)
        waits.extend(timing.waits)
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


def check_paths(
    paths: Sequence[str | os.PathLike[str]], storage_options: dict[str, Any] | None = None
) -> None:
    """Open every path once so a bad one fails before any measurement.

    Raises:
        PackerError: a path is missing, or neither a packer output nor an image folder.
    """
    if not paths:
        raise PackerError("no dataset given; pass one or more packer outputs or image folders")
    for path in paths:
        close_dataset(open_for_mode(path, "bytes", storage_options=storage_options))


def run_bench(paths: Sequence[str | os.PathLike[str]], spec: BenchSpec) -> Iterator[RunResult]:
    """Run every configuration of :func:`plan`, yielding each result as it is measured.

    A consumer interrupted with Ctrl-C keeps everything yielded so far. Ratios to the first path
    (the baseline) in the same (mode, workers, cache) are filled in as results arrive.
    """
    spec.validate()
    check_paths(paths, spec.storage_options)
    baselines: dict[tuple[str, int, str], float] = {}
    for path, label, mode, workers, cache in plan(paths, spec):
        result = run_config(path, label, mode, workers, cache, spec)
        key = (mode, workers, cache)
        if str(path) == str(paths[0]):
            baselines[key] = result.images_per_s
        base = baselines.get(key)
        result.ratio = result.images_per_s / base if base else None
        yield result
