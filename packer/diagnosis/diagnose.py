"""Diagnose any existing DataLoader: per-batch waits, the stall pattern, and what to change.

``packer.diagnose(loader, steps=50, step_ms=80)`` runs ``steps`` steps of the user's own loader
(their Dataset, transforms, sampler and collate), sleeping ``step_ms`` after each batch as if the
GPU consumed it, and returns a :class:`LoaderReport`: print it, or use ``.to_dict()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from packer.core.cpus import available_cpus
from packer.diagnosis.io_counters import process_threads
from packer.diagnosis.stalls import (
    HEADROOM,
    Stall,
    WaitStats,
    WorkerAdvice,
    advise_workers,
    batch_build_seconds,
    describe_stall,
    detect_stall,
    wait_stats,
)
from packer.diagnosis.timing import time_batches
from packer.errors import PackerError

__all__ = ["LoaderReport", "SampleCost", "diagnose", "load_loader", "sample_cost"]

SAMPLES = 16  # samples timed in this process for the per-sample cost


@dataclass
class LoaderReport:
    """What :func:`diagnose` measured and concluded. ``str(report)`` is the readable version.

    ``recommended_workers`` is ``workers.workers``: the one ``num_workers`` the text names.
    """

    steps: int
    batch_size: int | None
    num_workers: int
    step_ms: float
    waits: list[float]
    wait: WaitStats
    stall: Stall
    batch_ms: float
    wait_fraction: float
    recommended_workers: int
    cpus: int
    workers: WorkerAdvice
    sample_ms: float | None = None
    cpu_share: float | None = None
    worker_threads: list[int] = field(default_factory=list)
    persistent_workers: bool = False
    pin_memory: bool = False
    cuda: bool = False
    advice: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (waits in seconds, times in milliseconds where named ``_ms``)."""
        return asdict(self)

    def measurements(self) -> list[str]:
        """The measured lines, without advice (``packer doctor`` prints its own)."""
        w = self.wait
        lines = [
            f"{self.steps} steps of batch {self.batch_size} with {self.num_workers} workers, "
            f"simulated step {self.step_ms:g} ms, {self.cpus} CPUs",
            f"wait per batch: p50 {w.p50_ms:.1f} ms, p95 {w.p95_ms:.1f} ms, max {w.max_ms:.1f} ms;"
            f" the loop waited {100 * self.wait_fraction:.0f} % of the time (first round excluded)",
            "stall: " + describe_stall(self.stall, self.num_workers),
        ]
        if self.worker_threads:
            lines.append(
                "OS threads per worker process: " + ", ".join(map(str, self.worker_threads))
            )
        return lines

    def __str__(self) -> str:
        return "\n".join(self.measurements() + ["advice:"] + [f"  - {a}" for a in self.advice])


def _worker_pids(iterator: Any) -> list[int]:
    return [w.pid for w in getattr(iterator, "_workers", []) if getattr(w, "pid", None)]


def _timed_steps(
    loader: DataLoader, steps: int, step_s: float, time_limit_s: float | None
) -> tuple[list[float], list[int]]:
    """Each batch's wait over ``steps`` batches, and each worker's OS threads after the first."""
    threads: list[int] = []

    def read_threads(_: Any, it: Any) -> None:
        if not threads:
            threads.extend(t for t in map(process_threads, _worker_pids(it)) if t is not None)

    timing = time_batches(loader, steps, step_s, time_limit_s, on_batch=read_threads)
    return timing.waits, threads


class SampleCost(NamedTuple):
    """One sample's cost in this process: wall milliseconds (median, collate included) and the
    share of it spent computing (CPU time / wall time; the rest waits on storage)."""

    ms: float
    cpu_share: float


def runqueue_seconds() -> float:
    """Seconds this thread has spent ready to run but waiting for a CPU another process held
    (Linux ``/proc/thread-self/schedstat``, 2nd field; 0 where it is not available). On a
    loaded machine that time is neither computing nor waiting on storage."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _time_samples(dataset: Any, indices: list[int], time_limit_s: float) -> tuple[list, list]:
    """Load the samples one by one: [(wall s, CPU s)] per sample that loads, and the samples.
    The wall time leaves out the time the thread waited for a CPU held by other processes."""
    times, samples = [], []
    deadline = time.perf_counter() + time_limit_s
    for i in indices:
        t0, c0, q0 = time.perf_counter(), time.process_time(), runqueue_seconds()
        try:
            samples.append(dataset[i])
        except Exception:  # noqa: BLE001 - the user's dataset: a failing sample is not timed
            continue
        wall = time.perf_counter() - t0 - (runqueue_seconds() - q0)
        times.append((max(wall, 0.0), time.process_time() - c0))
        if time.perf_counter() > deadline:
            break
    return times, samples


def sample_cost(
    loader: DataLoader, count: int = SAMPLES, time_limit_s: float = 5.0
) -> SampleCost | None:
    """What one sample of ``loader.dataset`` costs in this process (median of up to ``count``
    spread samples after one warm-up, collate included: its time over them, per sample); None
    for a dataset without ``len`` and indexing (an ``IterableDataset``) or none that loads."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
        return None
    n = len(dataset)
    if n == 0 or count < 1:
        return None
    indices = sorted({int(i) for i in np.linspace(0, n - 1, min(n, count + 1)).round()})
    try:
        dataset[indices[0]]  # warm-up: first opens, imports, caches
    except Exception:  # noqa: BLE001 - the user's dataset: its failures are its own
        pass
    times, samples = _time_samples(dataset, indices[1:] or indices, time_limit_s)
    if not times:
        return None
    wall, cpu = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
    collate = 0.0
    if loader.batch_size is not None:
        t0 = time.perf_counter()
        try:
            loader.collate_fn(samples)
        except Exception:  # noqa: BLE001 - samples spread over the dataset may not batch
            pass
        collate = (time.perf_counter() - t0) / len(samples)
    return SampleCost(1e3 * (wall + collate), min(1.0, (cpu + collate) / max(wall + collate, 1e-9)))


def _cost_text(sample_ms: float | None, batch_size: int) -> str:
    if sample_ms is None:
        return "estimated from the waits: workers × mean(wait + step), an upper bound when fed"
    return f"median {sample_ms:.2f} ms per sample in one process × batch {batch_size}"


def _advice(report: LoaderReport) -> list[str]:
    out = [str(report.workers)]
    n, cpus = report.num_workers, report.cpus
    threads = max(report.worker_threads, default=0)
    if n and threads > 4 and n * threads > 2 * cpus:
        out.append(
            f"{n} workers × {threads} threads on {cpus} CPUs: limit threads per worker with"
            " worker_init_fn=packer.worker_init_fn"
        )
    if n and not report.persistent_workers:
        out.append("persistent_workers=True: keep workers (and their open files) across epochs")
    if report.cuda and not report.pin_memory:
        out.append(
            "pin_memory=True and .to(device, non_blocking=True): overlap copies with compute"
        )
    return out


def diagnose(
    loader: DataLoader,
    steps: int = 50,
    step_ms: float = 0.0,
    time_limit_s: float | None = None,
    headroom: float = HEADROOM,
    cost: SampleCost | None = None,
    current_label: str = "your current",
) -> LoaderReport:
    """Run ``steps`` steps of an existing DataLoader and explain where the loop waits.

    The ``num_workers`` advice comes from the cost of one sample, measured in this process after
    the run (median of up to 16 samples, collate included) × the batch size, the step time and
    the CPUs (:func:`~packer.diagnosis.stalls.advise_workers`); a loop already fed keeps its workers.

    Args:
        loader: any ``torch.utils.data.DataLoader`` (the user's dataset, transform and collate).
        steps: batches to time; several epochs are run when one is shorter.
        step_ms: simulated training step, slept after each batch (0: read as fast as possible).
        time_limit_s: stop early after this many seconds.
        headroom: factor applied to ``W / t`` in the worker recommendation.
        cost: the per-sample cost when the caller measured it (None: measured here).
        current_label: how the advice names the loader's workers ("your current 2 is enough").

    Raises:
        PackerError: ``loader`` is not a DataLoader, or an argument is out of range.
    """
    if not isinstance(loader, DataLoader):
        raise PackerError(f"diagnose needs a torch DataLoader, got {type(loader).__name__}")
    if steps < 2 or step_ms < 0:
        raise PackerError(f"need steps >= 2 and step_ms >= 0, got {steps} and {step_ms}")
    step_s, n = step_ms / 1e3, int(loader.num_workers)
    waits, threads = _timed_steps(loader, steps, step_s, time_limit_s)
    skip = min(max(1, n), max(0, len(waits) - 2))
    steady = waits[skip:]
    busy = sum(steady) / max(1e-12, sum(steady) + step_s * len(steady))
    cost = cost or sample_cost(loader)
    sample_ms = None if cost is None else cost.ms
    batch = loader.batch_size or 1
    batch_ms = (
        1e3 * batch_build_seconds(waits, step_s, n, skip)
        if sample_ms is None
        else sample_ms * batch
    )
    cpus = available_cpus()
    workers = advise_workers(
        batch_ms,
        step_ms,
        cpus,
        n,
        busy,
        headroom,
        _cost_text(sample_ms, batch),
        current_label,
        None if cost is None else cost.cpu_share,
    )
    report = LoaderReport(
        steps=len(waits),
        batch_size=loader.batch_size,
        num_workers=n,
        step_ms=step_ms,
        waits=waits,
        wait=wait_stats(waits),
        stall=detect_stall(waits, skip=skip),
        batch_ms=batch_ms,
        wait_fraction=busy,
        recommended_workers=workers.workers,
        cpus=cpus,
        workers=workers,
        sample_ms=sample_ms,
        cpu_share=None if cost is None else cost.cpu_share,
        worker_threads=threads,
        persistent_workers=bool(loader.persistent_workers),
        pin_memory=bool(loader.pin_memory),
        cuda=torch.cuda.is_available(),
    )
    report.advice = _advice(report)
    return report


def _import(module: str) -> Any:
    if module.endswith(".py"):
        path = Path(module)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if not path.is_file() or spec is None or spec.loader is None:
            raise PackerError(f"--loader: no Python file {module!r}")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = mod  # so its classes pickle for spawn workers
        spec.loader.exec_module(mod)
        return mod
    return importlib.import_module(module)


def load_loader(spec: str) -> DataLoader:
    """Call ``module:function`` (or ``path/file.py:function``) and return the DataLoader it makes.

    The current directory is importable, as with ``python -m``.

    Raises:
        PackerError: malformed spec, missing module or function, or not a DataLoader returned.
    """
    module, sep, name = spec.rpartition(":")
    if not sep or not module or not name.isidentifier():
        raise PackerError(
            f"--loader expects module:function (e.g. train:make_loader), got {spec!r}"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        mod = _import(module)
    except ImportError as exc:
        raise PackerError(f"--loader: cannot import module {module!r}: {exc}") from exc
    func = getattr(mod, name, None)
    if not callable(func):
        raise PackerError(f"--loader: module {module!r} has no function {name!r}")
    loader = func()
    if not isinstance(loader, DataLoader):
        raise PackerError(
            f"--loader: {spec} returned {type(loader).__name__}, not a torch DataLoader"
        )
    return loader
