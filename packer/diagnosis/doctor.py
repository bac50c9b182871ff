"""``packer doctor PATH``: a short, bounded set of measurements on the user's data, and a diagnosis.

1. disk: cold (evicted) vs page-cache read speed of a spread sample of the samples;
2. per-sample cost in one process: read vs decode vs transform;
3. CPUs vs workers, and the thread pools a worker starts;
4. a real DataLoader run with the standard transform and the per-batch waits
   (:func:`packer.diagnose`);
5. the recommendation: format and ``packer convert`` command, ONE ``num_workers`` (from the
   per-sample cost of 2., the step time and the CPUs: :func:`~packer.diagnosis.stalls.advise_workers`,
   the same rule as :func:`packer.diagnose`), ``persistent_workers``, ``pin_memory``, staging in
   ``/dev/shm``, thread limits.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from packer.core.cpus import available_cpus, memory_available, packer_home
from packer.core.manifest import MANIFEST_NAME, load_manifest
from packer.core.sizes import format_size
from packer.decode.outputs import decode
from packer.diagnosis.decode_advice import advise_dataset
from packer.diagnosis.diagnose import LoaderReport, SampleCost, diagnose
from packer.diagnosis.doctor_text import render
from packer.diagnosis.io_counters import resident_fraction
from packer.diagnosis.stalls import WorkerAdvice, advise_workers
from packer.diagnosis.targets import (
    bench_collate,
    close_dataset,
    cold_supported,
    evict_page_cache,
    files_for,
    open_for_mode,
    stored_bytes,
)
from packer.diagnosis.timing import time_batches
from packer.diagnosis.train_transform import train_transform
from packer.diagnosis.worker_threads import ThreadReport, worker_thread_report
from packer.errors import PackerError

__all__ = ["DiskSpeed", "DoctorReport", "doctor", "measure_disk", "measure_split"]


@dataclass
class DiskSpeed:
    """Reading ``samples`` samples (``bytes`` stored bytes) one by one, cold then warm."""

    samples: int
    bytes: int
    cold_s: float | None
    warm_s: float
    resident_before: float | None

    def rates(self, seconds: float | None) -> tuple[float, float]:
        """(MB/s, samples/s) for a duration."""
        if not seconds:
            return 0.0, 0.0
        return self.bytes / seconds / 1e6, self.samples / seconds

    def to_dict(self) -> dict[str, Any]:
        """Plain dict with the rates."""
        cold, warm = self.rates(self.cold_s), self.rates(self.warm_s)
        return {**asdict(self), "cold_mb_s": cold[0], "cold_files_s": cold[1],
                "warm_mb_s": warm[0], "warm_files_s": warm[1]}  # fmt: skip


def spread_indices(n: int, count: int) -> list[int]:
    """``count`` indices spread evenly over ``range(n)`` (random-access-like, deterministic)."""
    return sorted({int(i) for i in np.linspace(0, n - 1, min(n, count)).round()})


def _read_all(dataset: Any, indices: list[int], time_limit_s: float | None) -> tuple[int, float]:
    """Read the samples one by one (within the time limit); return how many, and the seconds."""
    timing = time_batches((dataset[i] for i in indices), time_limit_s=time_limit_s)
    return len(timing.waits), timing.seconds


def measure_disk(
    path: str | os.PathLike[str], indices: list[int], time_limit_s: float
) -> DiskSpeed:
    """Read the samples one by one after evicting their files (cold), then again (warm)."""
    dataset = open_for_mode(path, "bytes")
    files = files_for(dataset, path, indices)
    cold_s = resident = None
    if cold_supported():
        evict_page_cache(files)
        resident = resident_fraction(files)
        count, cold_s = _read_all(dataset, indices, time_limit_s)
        indices = indices[:count]
    count, warm_s = _read_all(dataset, indices, None)
    close_dataset(dataset)
    return DiskSpeed(count, stored_bytes(dataset, path, indices), cold_s, warm_s, resident)


def _where(dataset: Any, i: int) -> str:
    paths = getattr(dataset, "paths", None) or getattr(dataset, "keys", None)
    return str(paths[i]) if paths is not None else "?"


def measure_split(
    path: str | os.PathLike[str],
    indices: list[int],
    time_limit_s: float,
    broken: list[str] | None = None,
) -> dict[str, float]:
    """Milliseconds per sample of read (warm), decode and transform, in this process: the
    median of each over the samples (a slow outlier or the first open does not move it).

    Samples that fail to decode are left out and, when ``broken`` is given, described there.
    """
    dataset = open_for_mode(path, "bytes")
    transform = train_transform()
    times: dict[str, list[float]] = {"read": [], "decode": [], "transform": []}
    deadline = time.perf_counter() + time_limit_s
    for i in indices:
        t0 = time.perf_counter()
        data = dataset[i][0]
        t1 = time.perf_counter()
        try:
            image = [decode(d) for d in data] if isinstance(data, list) else decode(data)
        except (OSError, ValueError, SyntaxError) as exc:
            if broken is not None:
                broken.append(f"sample {i} ({_where(dataset, i)}): {exc}")
            continue
        t2 = time.perf_counter()
        transform(image)
        t3 = time.perf_counter()
        for name, seconds in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
            times[name].append(seconds)
        if t3 > deadline:
            break
    close_dataset(dataset)
    return {name: 1e3 * statistics.median(v) if v else 0.0 for name, v in times.items()}


def _format_of(path: Path) -> str:
    if (path / MANIFEST_NAME).is_file():
        return load_manifest(path).format
    return "folder"


@dataclass
class DoctorReport:
    """Everything ``packer doctor`` measured and concluded; ``str()`` is the printed diagnosis."""

    path: str
    format: str
    samples: int
    dataset_bytes: int
    batch_size: int
    step_ms: float | None
    cpus: int
    disk: DiskSpeed
    split_ms: dict[str, float]
    cold_read_ms: float | None
    worker_threads: ThreadReport
    loader: LoaderReport | None
    workers: WorkerAdvice | None = None
    recommended_workers: int = 0  # workers.workers: the one num_workers of the report
    findings: list[str] = field(default_factory=list)
    recommendations: list[str] = field(default_factory=list)
    convert_command: str | None = None
    elapsed_s: float = 0.0
    broken: list[str] = field(default_factory=list)
    loader_error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every measurement and conclusion."""
        out = asdict(self)
        out["disk"] = self.disk.to_dict()
        out["worker_threads"] = self.worker_threads.to_dict()
        out["loader"] = self.loader.to_dict() if self.loader else None
        return out

    def __str__(self) -> str:
        return render(self)


def _sample_cost(report: DoctorReport, fits_ram: bool) -> SampleCost:
    """One sample's read (cold when the data does not fit in RAM) + decode + transform, and
    the share of it that computes (all but a cold read's wait on the disk)."""
    read = report.split_ms["read"]
    if not fits_ram and report.cold_read_ms is not None:
        read = max(read, report.cold_read_ms)
    compute = report.split_ms["read"] + report.split_ms["decode"] + report.split_ms["transform"]
    total = read + report.split_ms["decode"] + report.split_ms["transform"]
    return SampleCost(total, compute / total if total > 0 else 1.0)


def _findings(report: DoctorReport) -> list[str]:
    cpu_ms = report.split_ms["decode"] + report.split_ms["transform"]
    out = []
    cold = report.cold_read_ms
    if cold is not None and cold > cpu_ms:
        out.append(
            f"your disk, not decode, is the bottleneck when the data is not in the page cache: "
            f"a cold read takes {cold:.2f} ms per sample, decode + transform {cpu_ms:.2f} ms"
        )
    else:
        read = f"{cold:.2f} ms cold" if cold is not None else f"{report.split_ms['read']:.2f} ms"
        out.append(
            f"decode + transform (CPU) dominate: {cpu_ms:.2f} ms per sample against {read} to read"
        )
    if report.broken:
        out.append(
            f"{len(report.broken)} of the sampled files cannot be decoded (first: "
            f"{report.broken[0]}); a DataLoader over them crashes mid-epoch. packer convert "
            "skips such files and lists them (packer inspect --skipped)"
        )
    if report.loader_error:
        out.append(f"the DataLoader run stopped with an error: {report.loader_error}")
    threads = report.worker_threads
    if threads.largest_pool > 1:
        unset = [k for k, v in threads.env.items() if not v]
        out.append(
            f"in a worker {', '.join(unset) or 'a thread variable'} "
            f"{'is' if len(unset) == 1 else 'are'} unset: an OpenMP/MKL library used there starts"
            f" up to {threads.largest_pool} threads, so N workers run N × {threads.largest_pool}"
            f" threads on {report.cpus} CPUs"
        )
    return out


def _recommend(report: DoctorReport, fits_ram: bool) -> tuple[list[str], str | None]:
    path = Path(report.path)
    out, command = [], None
    ram_dir = Path("/dev/shm")
    if report.format == "folder":
        dst = path.parent / f"{path.name}.lmdb"
        if fits_ram and ram_dir.is_dir():
            dst = ram_dir / f"{path.name}.lmdb"
        command = f"packer convert {path} {dst} --shard-size 1GB"
        out.append(f"convert the folder to LMDB (one open per shard, not per image): {command}")
    elif report.format == "bmp":
        out.append("BMP stores ~10× the bytes of JPEG: convert the source folder to .lmdb instead")
    staging = _staging(report, path, fits_ram, ram_dir)
    if staging:
        out.append(staging)
    if report.workers is not None:
        out.append(str(report.workers))
    out.append("persistent_workers=True (workers and their open files survive epochs)")
    if report.worker_threads.largest_pool > 1:
        out.append("worker_init_fn=packer.worker_init_fn (one thread per library in each worker)")
    if torch.cuda.is_available():
        out.append("pin_memory=True, and .to(device, non_blocking=True) in the loop")
    return out, command


def _staging(report: DoctorReport, path: Path, fits_ram: bool, ram_dir: Path) -> str | None:
    """Local staging through the shard cache (``open_dataset(..., cache_dir=)``): for a packed
    dataset of shards that fits in RAM (cached in ``/dev/shm``), or whose disk is the
    bottleneck (cached on a local disk: the default cache folder), read in place otherwise."""
    if report.format in ("folder", "bmp") or str(path).startswith(str(ram_dir)):
        return None
    cold, cpu_ms = report.cold_read_ms, report.split_ms["decode"] + report.split_ms["transform"]
    slow = cold is not None and cold > cpu_ms
    if fits_ram and ram_dir.is_dir():
        where, why = f"{ram_dir}/packer", "the dataset fits in RAM"
    elif slow:
        where, why = str(packer_home()), "the disk is the bottleneck"
    else:
        return None
    try:  # the limit holds every shard file (LMDB's pages: more than the records' bytes)
        held = sum(shard.bytes for shard in load_manifest(path).shards) or report.dataset_bytes
    except PackerError:
        held = report.dataset_bytes
    size = format_size(int(held * 1.1) + 1).replace(" ", "")  # room for the rounding
    command = f'packer.open_dataset("{path}", cache_dir="{where}", cache_limit="{size}")'
    return (
        f"{why}: stage it through the shard cache, each shard copied (and checked) on its "
        f"first read, shared by every worker and rank of the node, the next epochs read from "
        f"there: {command}"
        + ("" if where.startswith(str(ram_dir)) else " (cache_dir on a local SSD)")
    )


def doctor(
    path: str | os.PathLike[str],
    step_ms: float | None = None,
    batch_size: int = 64,
    workers: int | None = None,
    budget_s: float = 60.0,
    sample: int = 256,
) -> DoctorReport:
    """Measure a dataset on this machine and say what limits loading and what to change.

    Args:
        path: a packer output or an image folder.
        step_ms: the training step time to feed (None: as fast as possible).
        batch_size: batch size of the loader run and the worker formula.
        workers: num_workers of the loader run (default: min(4, CPUs)).
        budget_s: upper bound on the time spent measuring.
        sample: how many samples (spread over the dataset) the disk and split measure.

    Raises:
        PackerError: bad path or argument.
    """
    if budget_s <= 0 or batch_size < 1 or (step_ms is not None and step_ms <= 0):
        raise PackerError("need budget_s > 0, batch_size >= 1 and step_ms > 0")
    start = time.perf_counter()
    root = Path(path)
    probe = open_for_mode(root, "bytes")
    n = len(probe)  # type: ignore[arg-type]
    indices = spread_indices(n, sample)
    disk = measure_disk(root, indices, 0.2 * budget_s)
    broken: list[str] = []
    split = measure_split(root, indices[: disk.samples], 0.15 * budget_s, broken)
    per_sample = stored_bytes(probe, root, indices[: disk.samples]) / max(1, disk.samples)
    num_workers = min(4, available_cpus()) if workers is None else workers
    threads = worker_thread_report(open_for_mode(root, "transform"))
    report = DoctorReport(
        str(root), _format_of(root), n, int(per_sample * n), batch_size, step_ms,
        available_cpus(), disk, split,
        1e3 * disk.cold_s / disk.samples if disk.cold_s else None, threads, None,
    )  # fmt: skip
    report.broken = broken
    memory = memory_available()
    fits_ram = memory is not None and report.dataset_bytes < memory // 2
    cost = _sample_cost(report, fits_ram)
    try:
        time_left = budget_s - (time.perf_counter() - start)
        label = "the measured run's" if workers is None else "your"
        report.loader = _loader_run(root, report, num_workers, label, time_left, cost)
    except (PackerError, OSError, ValueError, RuntimeError) as exc:
        report.loader_error = str(exc).strip().splitlines()[-1]
    report.workers = _worker_advice(report, cost)
    report.recommended_workers = report.workers.workers
    report.findings = _findings(report)
    report.recommendations, report.convert_command = _recommend(report, fits_ram)
    if report.split_ms["decode"] > (report.cold_read_ms or report.split_ms["read"]):
        advice = advise_dataset(probe, indices[: disk.samples], root, report.format)
        report.findings += advice.findings
        report.recommendations += advice.recommendations
    report.elapsed_s = time.perf_counter() - start
    return report


def _worker_advice(report: DoctorReport, cost: SampleCost) -> WorkerAdvice:
    """The loader run's advice (same cost, plus whether that run kept the loop fed), or the
    same rule on the measured cost alone when there was no run."""
    if report.loader is not None:
        return report.loader.workers
    text = f"median read + decode + transform {cost.ms:.2f} ms per sample × batch"
    return advise_workers(
        cost.ms * report.batch_size, report.step_ms, report.cpus,
        cost=f"{text} {report.batch_size}", cpu_share=cost.cpu_share,
    )  # fmt: skip


def _loader_run(
    root: Path,
    report: DoctorReport,
    num_workers: int,
    label: str,
    time_left_s: float,
    cost: SampleCost,
) -> LoaderReport | None:
    """The real DataLoader run with the standard transform, in what is left of the budget
    (``label``: how the advice names its workers)."""
    batches = report.samples // report.batch_size
    if batches < 3 or time_left_s < 2:
        return None
    loader = DataLoader(
        open_for_mode(root, "transform"),
        batch_size=report.batch_size,
        shuffle=True,
        num_workers=num_workers,
        collate_fn=bench_collate,
        drop_last=True,
    )
    steps = max(2, min(batches, 8 * max(1, num_workers) + 1, 60))
    step_ms, limit_s = report.step_ms or 0.0, 0.8 * time_left_s
    return diagnose(loader, steps, step_ms, time_limit_s=limit_s, cost=cost, current_label=label)
