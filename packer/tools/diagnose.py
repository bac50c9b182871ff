"""Diagnose any existing DataLoader: per-batch waits, the stall pattern, and what to change.

``packer.diagnose(loader, steps=50, step_ms=80)`` runs ``steps`` steps of the user's own loader
(their Dataset, transforms, sampler and collate), sleeping ``step_ms`` after each batch as if the
GPU consumed it, and returns a :class:`LoaderReport`: print it, or use ``.to_dict()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from packer.errors import PackerError
from packer.tools.io_counters import process_threads
from packer.tools.stalls import (
    HEADROOM,
    Stall,
    WaitStats,
    batch_build_seconds,
    describe_stall,
    detect_stall,
    recommend_workers,
    wait_stats,
)
from packer.tools.timing import time_batches
from packer.tools.worker_threads import available_cpus

__all__ = ["LoaderReport", "diagnose", "load_loader"]

BUSY = 0.05  # the loop counts as data-bound when it waits more than this share of the time


@dataclass
class LoaderReport:
    """What :func:`diagnose` measured and concluded. ``str(report)`` is the readable version."""

    steps: int
    batch_size: int | None
    num_workers: int
    step_ms: float
    waits: list[float]
    wait: WaitStats
    stall: Stall
    batch_ms: float
    wait_fraction: float
    recommended_workers: int | None
    cpus: int
    worker_threads: list[int] = field(default_factory=list)
    persistent_workers: bool = False
    pin_memory: bool = False
    cuda: bool = False
    advice: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (waits in seconds, times in milliseconds where named ``_ms``)."""
        return asdict(self)

    def __str__(self) -> str:
        w = self.wait
        lines = [
            f"{self.steps} steps of batch {self.batch_size}, num_workers={self.num_workers}, "
            f"simulated step {self.step_ms:g} ms, {self.cpus} CPUs",
            f"wait per batch: p50 {w.p50_ms:.1f} ms, p95 {w.p95_ms:.1f} ms, max {w.max_ms:.1f} ms;"
            f" the loop waited {100 * self.wait_fraction:.0f} % of the time (first round excluded)",
            "stall: " + describe_stall(self.stall, self.num_workers),
            _batch_line(self),
        ]
        if self.worker_threads:
            lines.append(
                "OS threads per worker process: " + ", ".join(map(str, self.worker_threads))
            )
        lines += ["advice:"] + [f"  - {line}" for line in self.advice]
        return "\n".join(lines)


def _batch_line(report: LoaderReport) -> str:
    n, t = report.num_workers, report.step_ms
    how = f"{n} workers × mean(wait + step)" if n else "mean wait: the main process builds it"
    text = f"one batch takes W ≈ {report.batch_ms:.1f} ms to build ({how})"
    if report.wait_fraction < BUSY:
        text += "; the loop hardly waits, so this is an upper bound"
    elif t > 0:
        text += f"; for a {t:g} ms step num_workers >= W / t = {report.batch_ms / t:.1f}"
    return text


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


def _advice(report: LoaderReport, headroom: float) -> list[str]:
    out = []
    n, cpus = report.num_workers, report.cpus
    need = report.recommended_workers
    if report.wait_fraction < BUSY:
        out.append(f"the loader keeps up: num_workers={n} is enough for this step time")
    elif report.step_ms <= 0:
        out.append("pass step_ms (your training step time) to get a num_workers recommendation")
    elif need is not None:
        out.append(
            f"num_workers={need} (= ceil({headroom:g} × W / t), {headroom:g} = headroom for jitter)"
        )
        if need > cpus:
            out.append(
                f"{need} workers exceed the {cpus} CPUs: if building a batch is CPU work"
                " (decode, transform), cheaper samples help more than workers: pack the data"
                " (packer convert), store smaller images, or decode on the GPU"
            )
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
) -> LoaderReport:
    """Run ``steps`` steps of an existing DataLoader and explain where the loop waits.

    Args:
        loader: any ``torch.utils.data.DataLoader`` (the user's dataset, transform and collate).
        steps: batches to time; several epochs are run when one is shorter.
        step_ms: simulated training step, slept after each batch (0: read as fast as possible).
        time_limit_s: stop early after this many seconds.
        headroom: factor applied to ``W / t`` in the worker recommendation.

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
    batch_s = batch_build_seconds(waits, step_s, n, skip)
    report = LoaderReport(
        steps=len(waits),
        batch_size=loader.batch_size,
        num_workers=n,
        step_ms=step_ms,
        waits=waits,
        wait=wait_stats(waits),
        stall=detect_stall(waits, skip=skip),
        batch_ms=batch_s * 1e3,
        wait_fraction=busy,
        recommended_workers=recommend_workers(batch_s, step_s, headroom) if step_s > 0 else None,
        cpus=available_cpus(),
        worker_threads=threads,
        persistent_workers=bool(loader.persistent_workers),
        pin_memory=bool(loader.pin_memory),
        cuda=torch.cuda.is_available(),
    )
    report.advice = _advice(report, headroom)
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
