#!/usr/bin/env python
"""Read throughput of packer's formats against a plain JPEG folder, through a real DataLoader.

Generates (or reuses) a photo-like JPEG tree under ``--data``, converts it to ``.lmdb``, ``.h5``,
``.npy`` and ``.bmp`` (reusing complete outputs of the same size), then times full passes over
every dataset with ``packer.tools.timing.measure_throughput``:

- datasets: the JPEG folder (``packer.FolderDataset``, the baseline), an in-memory list of the
  same JPEG bytes (the ceiling: no I/O at all) and each packed output (``packer.open_dataset``);
- modes: ``bytes`` (``output="bytes"``) and ``decoded`` (``output="numpy"``);
- ``num_workers`` 0 and 2, batch 64, page cache ``warm`` (files read once just before the pass)
  and ``cold`` (``packer.tools.targets.evict_page_cache`` just before the pass; residency is checked
  with ``mincore`` and recorded); in bytes mode with workers > 0 also ``packer.collate_bytes``.

Every configuration runs ``--repeats`` times, interleaved (one pass of each configuration per
round, every other round in reverse order), and the median pass is reported with its ratio to
the JPEG folder measured in the same run and the same (mode, workers, cache) setting, and to
the in-memory ceiling.

Each pass runs in a freshly forked child of the same parent, so nothing one pass leaves behind
(an allocator setting such as packer's ``mallopt``, heap layout, open LMDB environments, mapped
shards: a mapped page cannot be evicted, which would make "cold" warm) reaches the next; the
child builds a fresh dataset and closes its reader at the end. Each pass also records its CPU time and page faults (this process and its reaped DataLoader workers) and
the share of the CPUs other processes used meanwhile; on a shared machine the script first waits
(``--quiet-below``, within ``--wait-budget`` seconds in all) for other processes to go quiet.

Usage::

    python benchmarks/read_throughput.py --quick          # 500 images, 1 round: a smoke test
    python benchmarks/read_throughput.py                  # 5000 images, 3 rounds
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

import packer
from packer import iostats
from packer.decode import decode
from packer.manifest import MANIFEST_NAME, load_manifest
from packer.sources import scan
from packer.tools.image_demo import make_image_tree
from packer.tools.targets import data_files, evict_page_cache
from packer.tools.timing import Throughput, measure_throughput, median_run

CLASSES = 10
FOLDER = "jpeg folder"
MEMORY = "memory"
FORMATS = {"lmdb": ".lmdb", "hdf5": ".h5", "npy": ".npy", "bmp": ".bmp"}
MODES = {"bytes": "bytes", "decoded": "numpy"}  # mode -> the datasets' output=
DEFAULT_COLLATE = "default"  # measure_throughput's own list collate
COLLATE_BYTES = "collate_bytes"


# --------------------------------------------------------------------------------------------
# The in-memory ceiling


class InMemoryDataset(Dataset):
    """The JPEG bytes held in a Python list: what reading costs with no I/O at all.

    ``bytes`` returns the stored object itself (no copy); ``numpy`` decodes it with the same
    ``packer.decode.decode`` every packer dataset uses.
    """

    def __init__(self, blobs: Sequence[bytes], labels: Sequence[int], output: str) -> None:
        self.blobs = list(blobs)
        self.labels = [int(x) for x in labels]
        self.output = output

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        data = self.blobs[i]
        return (data if self.output == "bytes" else decode(data, self.output)), self.labels[i]


# --------------------------------------------------------------------------------------------
# Page-cache helpers


def resident_fraction(paths: Iterable[Path]) -> float | None:
    """Fraction of *all* the files' pages in the page cache (``mincore``); None off Linux."""
    files = list(paths)
    return iostats.resident_fraction(files, max_files=max(1, len(files)))


def prewarm(paths: Iterable[Path]) -> None:
    """Read every file once so its pages are in the page cache."""
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while fh.read(8 << 20):
                pass


def _host_busy_seconds() -> float | None:
    """CPU seconds all processes of the machine have run (``/proc/stat``); None off Linux."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


OTHERS_WINDOW = 0.2


def others_share(window: float = OTHERS_WINDOW) -> float | None:
    """Share of the machine's CPUs busy over ``window`` seconds while this process sleeps."""
    before = _host_busy_seconds()
    if before is None:
        return None
    cpu_before = _own_usage()[0]
    time.sleep(window)
    busy = (_host_busy_seconds() or before) - before - (_own_usage()[0] - cpu_before)
    return max(0.0, busy) / (window * (os.cpu_count() or 1))


class QuietWaiter:
    """Before a pass, wait (within a total budget) until other processes leave the CPUs alone.

    On a shared machine another job's burst can halve a pass's throughput. Waiting until the
    other processes' CPU share drops under ``threshold`` keeps most passes clean; the budget
    bounds the run time, and each pass still records the share it actually saw.
    """

    def __init__(self, threshold: float, budget: float) -> None:
        self.threshold = threshold
        self.budget = budget
        self.waited = 0.0

    def wait(self) -> float:
        """Seconds waited before this pass, beyond the one check every pass makes."""
        share = others_share()
        start = time.perf_counter()
        while share is not None and share > self.threshold and self.waited < self.budget:
            share = others_share()
            self.waited += OTHERS_WINDOW
        return time.perf_counter() - start


def _own_usage() -> tuple[float, int]:
    """CPU seconds and minor page faults of this process and its reaped children (workers)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    return cpu, me.ru_minflt + kids.ru_minflt


# --------------------------------------------------------------------------------------------
# Data preparation


def prepare_data(root: Path, images: int, log: Any) -> tuple[Path, dict[str, Path]]:
    """Make (or reuse) the JPEG tree and its four packed copies; return their paths."""
    per_class = images // CLASSES
    work = root / f"n{images}"
    src = work / "images"
    marker = work / "images.json"
    expected = {"classes": CLASSES, "per_class": per_class, "bad": 0, "seed": 0}
    reuse = False
    if marker.is_file() and src.is_dir():
        try:
            reuse = json.loads(marker.read_text()) == expected and len(scan(src).samples) == images
        except (ValueError, packer.PackerError):
            reuse = False
    if reuse:
        log(f"reusing {src} ({images} JPEGs)")
    else:
        if src.exists():
            shutil.rmtree(src)
        marker.unlink(missing_ok=True)
        log(f"generating {images} photo-like JPEGs in {src} ...")
        start = time.perf_counter()
        make_image_tree(src, classes=CLASSES, per_class=per_class, bad=0)
        marker.write_text(json.dumps(expected))
        log(f"  done in {time.perf_counter() - start:.1f} s")
    outputs: dict[str, Path] = {}
    for name, suffix in FORMATS.items():
        dst = work / f"images{suffix}"
        outputs[name] = dst
        if reuse and _is_complete(dst, images):  # a regenerated source invalidates outputs
            log(f"reusing {dst}")
            continue
        log(f"converting to {dst} ...")
        start = time.perf_counter()
        packer.convert(src, dst, overwrite=True, progress=False)
        log(f"  done in {time.perf_counter() - start:.1f} s")
    return src, outputs


def _is_complete(dst: Path, images: int) -> bool:
    if not (dst / MANIFEST_NAME).is_file():
        return False
    try:
        return load_manifest(dst).num_samples == images
    except packer.PackerError:
        return False


def disk_bytes(path: Path) -> int:
    """Bytes on disk of a file or a folder's files."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


# --------------------------------------------------------------------------------------------
# Configurations and passes


@dataclass(frozen=True)
class Config:
    """One measured configuration."""

    dataset: str
    mode: str
    workers: int
    cache: str  # "warm", "cold", or "-" for the in-memory dataset
    collate: str

    @property
    def setting(self) -> tuple[str, int, str]:
        """The (mode, workers, cache) the baseline ratios are taken in."""
        return self.mode, self.workers, self.cache


def make_configs(
    datasets: Sequence[str],
    modes: Sequence[str],
    workers: Sequence[int],
    caches: Sequence[str],
    cold_decoded_workers: Sequence[int] | None = None,
) -> list[Config]:
    """Every configuration, in the order of the table and of each round.

    ``cold_decoded_workers`` limits decoded passes with a cold cache to those worker counts
    (None: all of ``workers``); decoding dominates them, and each costs a ~10 s pass.
    """
    configs = []
    for mode in modes:
        for w in workers:
            collates = [DEFAULT_COLLATE] + ([COLLATE_BYTES] if mode == "bytes" and w > 0 else [])
            for collate in collates:
                if MEMORY in datasets:
                    configs.append(Config(MEMORY, mode, w, "-", collate))
                for cache in caches:
                    if (
                        mode == "decoded"
                        and cache == "cold"
                        and cold_decoded_workers is not None
                        and w not in cold_decoded_workers
                    ):
                        continue
                    for name in datasets:
                        if name != MEMORY:
                            configs.append(Config(name, mode, w, cache, collate))
    return configs


class Bench:
    """The datasets' paths and the in-memory bytes; runs single passes."""

    def __init__(
        self, src: Path, outputs: dict[str, Path], batch_size: int, in_process: bool = False
    ) -> None:
        self.in_process = in_process
        self.paths: dict[str, Path] = {FOLDER: src, **outputs}
        self.files = {name: data_files(path) for name, path in self.paths.items()}
        self.batch_size = batch_size
        samples = scan(src).samples
        self.blobs = [Path(s.path).read_bytes() for s in samples]
        self.labels = [s.label for s in samples]

    def make_dataset(self, name: str, mode: str) -> Dataset:
        output = MODES[mode]
        if name == MEMORY:
            return InMemoryDataset(self.blobs, self.labels, output)
        if name == FOLDER:
            return packer.FolderDataset(self.paths[name], output=output)
        return packer.open_dataset(self.paths[name], output=output)

    def run(self, config: Config, waiter: QuietWaiter | None = None) -> dict[str, Any]:
        """One timed pass of ``config``, in a forked child unless ``in_process``."""
        waited = waiter.wait() if waiter is not None else 0.0
        if self.in_process or not hasattr(os, "fork"):
            result = self.one_pass(config)
        else:
            result = in_child(self.one_pass, config)
        return {**result, "waited_s": waited}

    def one_pass(self, config: Config) -> dict[str, Any]:
        """One timed pass of ``config`` on a fresh dataset, in this process."""
        dataset = self.make_dataset(config.dataset, config.mode)
        resident = None
        if config.cache == "cold":
            evict_page_cache(self.files[config.dataset])
            resident = resident_fraction(self.files[config.dataset])
        elif config.cache == "warm":
            resident = resident_fraction(self.files[config.dataset])
            if resident is None or resident < 1.0:
                prewarm(self.files[config.dataset])
                resident = resident_fraction(self.files[config.dataset])
        gc.collect()
        host_before, (cpu_before, faults_before) = _host_busy_seconds(), _own_usage()
        try:
            result = measure_throughput(
                dataset,
                num_workers=config.workers,
                batch_size=self.batch_size,
                collate_fn=packer.collate_bytes if config.collate == COLLATE_BYTES else None,
            )
            host_after, (cpu_after, faults_after) = _host_busy_seconds(), _own_usage()
        finally:
            reader = getattr(dataset, "reader", None)
            if reader is not None:
                reader.close()  # unmap shards: mapped pages cannot be evicted by the next pass
            del dataset
            gc.collect()
        own_cpu = cpu_after - cpu_before
        others = None  # share of the machine's CPUs used by other processes during the pass
        # /proc/stat counts in 10 ms ticks: too coarse for a pass shorter than ~0.2 s
        if host_before is not None and host_after is not None and result.seconds >= 0.2:
            busy = host_after - host_before
            others = max(0.0, busy - own_cpu) / (result.seconds * (os.cpu_count() or 1))
        return {
            **result.to_dict(),
            "resident_before": resident,
            "cpu_s": own_cpu,
            "minor_faults_per_image": (faults_after - faults_before) / max(result.images, 1),
            "others_cpu_share": others,
        }


def in_child(function: Any, *args: Any) -> dict[str, Any]:
    """``function(*args)`` (a JSON-able dict) computed in a forked child process.

    Every pass starts from the same parent state: no allocator setting (packer's readers may
    call ``mallopt``), heap layout, open environment or handle cache left by an earlier pass.
    """
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never return into the caller's code
        code = 1
        try:
            os.close(read_end)
            try:
                payload = {"ok": function(*args)}
            except BaseException:
                import traceback

                payload = {"error": traceback.format_exc()}
            data = json.dumps(payload).encode()
            while data:
                data = data[os.write(write_end, data) :]
            code = 0
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"benchmark child {pid} died (wait status {status})")
    payload = json.loads(data)
    if "error" in payload:
        raise RuntimeError(f"benchmark pass failed in child {pid}:\n{payload['error']}")
    return payload["ok"]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------------------------
# Results


def summarise(configs: Sequence[Config], runs: dict[Config, list[dict[str, Any]]]) -> list[dict]:
    """One row per configuration: median pass, spread, ratios to the folder and to memory."""
    medians = {}
    for config in configs:
        passes = [Throughput(r["images"], r["bytes"], r["seconds"]) for r in runs[config]]
        medians[config] = median_run(passes)
    rows = []
    for config in configs:
        med = medians[config]
        rates = [r["images_per_s"] for r in runs[config]]
        # The folder with the default collate, in the same (mode, workers, cache); the memory
        # rows have no cache setting and are compared with the warm folder.
        cache = "warm" if config.cache == "-" else config.cache
        folder = medians.get(Config(FOLDER, config.mode, config.workers, cache, DEFAULT_COLLATE))
        memory = medians.get(Config(MEMORY, config.mode, config.workers, "-", config.collate))
        residents = [r["resident_before"] for r in runs[config] if r["resident_before"] is not None]
        others = [r["others_cpu_share"] for r in runs[config] if r["others_cpu_share"] is not None]
        rows.append(
            {
                "dataset": config.dataset,
                "mode": config.mode,
                "workers": config.workers,
                "cache": config.cache,
                "collate": config.collate,
                "images_per_s": med.images_per_s,
                "mb_per_s": med.mb_per_s,
                "seconds": med.seconds,
                "spread": (max(rates) - min(rates)) / med.images_per_s if med.seconds else 0.0,
                "vs_folder": med.images_per_s / folder.images_per_s if folder else None,
                "vs_memory": med.images_per_s / memory.images_per_s if memory else None,
                "resident_before": (min(residents), max(residents)) if residents else None,
                "cpu_us_per_image": 1e6
                * statistics.median(r["cpu_s"] / r["images"] for r in runs[config]),
                "others_cpu_share": statistics.median(others) if others else None,
                "runs": runs[config],
            }
        )
    return rows


def _find(rows: Sequence[dict], **match: Any) -> dict | None:
    for row in rows:
        if all(row[k] == v for k, v in match.items()):
            return row
    return None


def evaluate_targets(rows: Sequence[dict], formats: Sequence[str]) -> list[dict[str, Any]]:
    """The README's targets, one check per (target, format, setting) that was measured."""
    checks = []

    def add(target: str, threshold: float, row: dict | None, key: str) -> None:
        if row is None or row[key] is None:
            return
        checks.append(
            {
                "target": target,
                "dataset": row["dataset"],
                "mode": row["mode"],
                "workers": row["workers"],
                "cache": row["cache"],
                "collate": row["collate"],
                "ratio": row[key],
                "threshold": threshold,
                "met": row[key] >= threshold,
            }
        )

    for name in formats:
        for cache in ("warm", "cold"):
            if name in ("lmdb", "npy"):
                row = _find(rows, dataset=name, mode="bytes", workers=0, cache=cache)
                add("bytes, workers 0: >= 3x folder", 3.0, row, "vs_folder")
            row = _find(
                rows, dataset=name, mode="bytes", workers=2, cache=cache, collate=COLLATE_BYTES
            )
            add("bytes, workers 2, collate_bytes: >= 1.5x folder", 1.5, row, "vs_folder")
            for w in (0, 2):
                row = _find(rows, dataset=name, mode="decoded", workers=w, cache=cache)
                add("decoded: >= 0.97x in-memory decode", 0.97, row, "vs_memory")
    return checks


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}×"


def markdown_table(rows: Sequence[dict]) -> str:
    """The results as a markdown table."""
    lines = [
        "| dataset | mode | workers | cache | collate | images/s | MB/s | × folder | × memory "
        "| spread | CPU µs/img | others' CPU |",
        "|---|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        others = r["others_cpu_share"]
        lines.append(
            f"| {r['dataset']} | {r['mode']} | {r['workers']} | {r['cache']} | {r['collate']} "
            f"| {r['images_per_s']:,.0f} | {r['mb_per_s']:,.0f} | {_ratio(r['vs_folder'])} "
            f"| {_ratio(r['vs_memory'])} | {100 * r['spread']:.0f}% "
            f"| {r['cpu_us_per_image']:,.0f} | {'' if others is None else f'{100 * others:.0f}%'} |"
        )
    return "\n".join(lines)


def targets_table(checks: Sequence[dict]) -> str:
    """The target checks as a markdown table."""
    lines = [
        "| target | dataset | workers | cache | ratio | met |",
        "|---|---|--:|---|--:|---|",
    ]
    for c in checks:
        lines.append(
            f"| {c['target']} | {c['dataset']} | {c['workers']} | {c['cache']} "
            f"| {c['ratio']:.2f}× | {'yes' if c['met'] else '**no**'} |"
        )
    return "\n".join(lines)


def _git(*args: str) -> str:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _source_digest(root: Path) -> str:
    """SHA-256 of packer's ``.py`` files as they were when the run started (uncommitted too)."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def machine_info() -> dict[str, Any]:
    """Where and with what the numbers were measured."""
    import h5py
    import lmdb
    import PIL

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "pillow": PIL.__version__,
        "lmdb": getattr(lmdb, "__version__", ""),
        "h5py": h5py.__version__,
        "packer": packer.__version__,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": _git("status", "--porcelain", "--untracked-files=no", "--", "packer"),
        "packer_source_sha256": _source_digest(Path(packer.__file__).parent),
    }
    try:
        with open("/proc/cpuinfo") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        info["cpu_model"] = names[0] if names else ""
        with open("/proc/meminfo") as fh:
            info["mem_total"] = fh.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    return info


# --------------------------------------------------------------------------------------------
# Command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("bench-data"), help="work folder")
    parser.add_argument("--images", type=int, default=5000, help="images (a multiple of 10)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="num_workers")
    parser.add_argument(
        "--cold-decoded-workers",
        type=int,
        nargs="*",
        default=[0],
        help="num_workers measured in decoded mode with a cold cache (default 0 only, which keeps "
        "the full run near 15 min on 2 cores; pass e.g. '0 2' for the whole matrix)",
    )
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--caches", nargs="+", choices=["warm", "cold"], default=["warm", "cold"])
    parser.add_argument(
        "--formats", nargs="+", choices=list(FORMATS), default=list(FORMATS), help="packed formats"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="JSON folder")
    parser.add_argument(
        "--quiet-below",
        type=float,
        default=0.15,
        help="before each pass wait until other processes use less than this share of the CPUs",
    )
    parser.add_argument(
        "--wait-budget",
        type=float,
        default=60.0,
        help="total seconds the run may spend waiting for a quiet machine (0: never wait)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every pass in this process instead of a fresh forked child (for profiling)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: 500 images, 1 round")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats = 500, 1
    if args.images < CLASSES or args.images % CLASSES:
        parser.error(f"--images must be a positive multiple of {CLASSES}")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(args: argparse.Namespace) -> int:
    """Prepare the data, run every configuration, print the table, write the JSON."""
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    info = machine_info()
    log(f"{info['platform']}, {info['cpu_count']} CPUs, torch {info['torch']}")
    args.data.mkdir(parents=True, exist_ok=True)
    src, outputs = prepare_data(args.data, args.images, log)
    outputs = {name: path for name, path in outputs.items() if name in args.formats}
    bench = Bench(src, outputs, args.batch_size, in_process=args.in_process)
    datasets = [FOLDER, MEMORY, *outputs]
    configs = make_configs(
        datasets, args.modes, args.workers, args.caches, args.cold_decoded_workers
    )
    log(f"{len(configs)} configurations × {args.repeats} interleaved rounds")

    runs: dict[Config, list[dict[str, Any]]] = {c: [] for c in configs}
    waiter = QuietWaiter(args.quiet_below, args.wait_budget) if args.wait_budget > 0 else None
    load_before = os.getloadavg() if hasattr(os, "getloadavg") else None
    for round_number in range(args.repeats):
        round_start = time.perf_counter()
        # Every other round runs backwards, so a slow drift of the machine favours no one.
        for config in configs if round_number % 2 == 0 else configs[::-1]:
            result = bench.run(config, waiter)
            runs[config].append(result)
            log(
                f"round {round_number + 1}/{args.repeats} {config.dataset:>11} {config.mode:>7} "
                f"w{config.workers} {config.cache:>4} {config.collate:>13}: "
                f"{result['images_per_s']:8,.0f} img/s {result['mb_per_s']:7,.0f} MB/s"
                + (f" waited {result['waited_s']:.1f}s" if result["waited_s"] >= 0.05 else "")
                + (
                    f" others {100 * result['others_cpu_share']:3.0f}%"
                    if result["others_cpu_share"] is not None
                    else ""
                )
                + (
                    f" (resident {100 * result['resident_before']:.0f}%)"
                    if result["resident_before"] is not None
                    else ""
                )
            )
        log(f"round {round_number + 1} took {time.perf_counter() - round_start:.0f} s")

    rows = summarise(configs, runs)
    checks = evaluate_targets(rows, list(outputs))
    cold = [r["resident_before"][1] for r in rows if r["cache"] == "cold" and r["resident_before"]]
    if waiter is not None:
        log(f"waited {waiter.waited:.0f} s in all for other processes to go quiet")
    if cold and max(cold) > 0.01:
        log(f"WARNING: up to {100 * max(cold):.1f}% of a dataset stayed cached before a cold pass")

    print(markdown_table(rows))
    print()
    print(targets_table(checks))

    sizes = {FOLDER: disk_bytes(src), **{n: disk_bytes(p) for n, p in outputs.items()}}
    report = {
        "benchmark": "read_throughput",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": info,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "images": args.images,
        "disk_bytes": sizes,
        "seconds_total": time.perf_counter() - started,
        "seconds_waiting_for_quiet": waiter.waited if waiter is not None else 0.0,
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "results": rows,
        "targets": checks,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "read_throughput.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {path} (total {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
