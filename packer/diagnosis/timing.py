"""The one timing loop of packer's measurements, and the throughput of one timed pass.

:func:`time_batches` iterates anything (a DataLoader, a generator of samples) and records how
long each ``next()`` waited. ``packer bench`` (:mod:`packer.bench.bench`), ``packer doctor``
and :func:`packer.diagnose`, ``packer demo`` and ``benchmarks/`` all time through it, so their
numbers mean the same thing: the first wait includes creating the iterator (starting the
workers), and ``seconds`` runs from before ``iter()`` to after the iterator is released.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torch.utils.data import DataLoader, Dataset, Sampler

from packer.errors import PackerError

__all__ = ["Throughput", "Timing", "measure_throughput", "median_run", "time_batches"]


@dataclass
class Timing:
    """What :func:`time_batches` measured: the wait of every batch and the total time."""

    waits: list[float] = field(default_factory=list)
    seconds: float = 0.0
    epochs: int = 0


def _one_epoch(
    batches: Iterable[Any],
    timing: Timing,
    steps: int | None,
    step_s: float,
    deadline: float | None,
    on_batch: Callable[[Any, Iterator[Any]], None] | None,
) -> bool:
    """Time one pass over ``batches`` into ``timing``; return whether to stop (steps, deadline)."""
    before = time.perf_counter()
    it = iter(batches)
    for batch in it:
        timing.waits.append(time.perf_counter() - before)
        if on_batch is not None:
            on_batch(batch, it)
        if (steps is not None and len(timing.waits) >= steps) or (
            deadline is not None and time.perf_counter() > deadline
        ):
            return True
        if step_s > 0:
            time.sleep(step_s)
        before = time.perf_counter()
    return False


def time_batches(
    batches: Iterable[Any],
    steps: int | None = None,
    step_s: float = 0.0,
    time_limit_s: float | None = None,
    on_batch: Callable[[Any, Iterator[Any]], None] | None = None,
) -> Timing:
    """Iterate ``batches`` and time each ``next()``: the one timing loop of packer's tools.

    Args:
        batches: a DataLoader or any iterable; it is iterated again (a new epoch) while fewer
            than ``steps`` batches were seen.
        steps: stop after this many batches (None: exactly one pass).
        step_s: seconds of sleep after each batch, standing in for a training step.
        time_limit_s: stop after the batch that ends past this many seconds.
        on_batch: called with each batch and its iterator, outside the measured waits.

    Raises:
        PackerError: ``steps`` was given and a pass yielded no batch.
    """
    deadline = time.perf_counter() + time_limit_s if time_limit_s else None
    timing = Timing()
    start = time.perf_counter()
    while True:
        seen = len(timing.waits)
        stop = _one_epoch(batches, timing, steps, step_s, deadline, on_batch)
        timing.epochs += 1
        if stop or steps is None:
            break
        if len(timing.waits) == seen:
            raise PackerError("the DataLoader yielded no batch; is its dataset empty?")
        if deadline is not None and time.perf_counter() > deadline:
            break
    timing.seconds = time.perf_counter() - start
    return timing


class Rates:
    """Per-second rates of a measurement holding ``images``, ``bytes`` and ``seconds``."""

    images: int
    bytes: int
    seconds: float

    @property
    def images_per_s(self) -> float:
        """Images (or clips) per second."""
        return self.images / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        """Megabytes (10^6) of stored payload per second."""
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else 0.0


@dataclass
class Throughput(Rates):
    """One timed pass over a dataset through a DataLoader."""

    images: int
    bytes: int
    seconds: float

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


def _list_collate(batch: Sequence[Any]) -> list[Any]:
    return list(batch)


def measure_throughput(
    dataset: Dataset,
    num_workers: int = 0,
    batch_size: int = 64,
    collate_fn: Callable[[Any], Any] | None = None,
    shuffle: bool = False,
    multiprocessing_context: str | None = None,
    sampler: Sampler | Iterable[int] | None = None,
) -> Throughput:
    """Time one full pass over ``dataset`` through a real DataLoader (worker start-up included).

    ``images`` counts the samples (clips, for a video dataset); ``bytes`` the sizes of their
    first fields when those are bytes, arrays or tensors (a ``collate_bytes`` batch: its data).
    """
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_fn if collate_fn is not None else _list_collate,
        shuffle=shuffle,
        sampler=sampler,
        multiprocessing_context=multiprocessing_context if num_workers > 0 else None,
    )
    counts = [0, 0]

    def count(batch: Any, _: Iterator[Any]) -> None:
        if isinstance(batch, list):
            counts[0] += len(batch)
            counts[1] += sum(_size_of(item[0]) for item in batch)
        else:  # collate_bytes: (data, offsets, labels)
            counts[0] += len(batch[-1])
            counts[1] += _size_of(batch[0])

    timing = time_batches(loader, on_batch=count)
    return Throughput(counts[0], counts[1], timing.seconds)


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
