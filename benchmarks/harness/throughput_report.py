"""Results of ``benchmarks/read_throughput.py``: median rows, the README's targets, tables, machine.

Pure functions over the passes :func:`harness.throughput.run_rounds` returns; no timing here.
"""

from __future__ import annotations

import hashlib
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import packer
from harness.throughput import (
    COLLATE_BYTES,
    DEFAULT_COLLATE,
    FOLDER,
    MEMORY,
    PLAIN_LMDB,
    Config,
)
from packer.bench.bench_report import markdown_table as table
from packer.diagnosis.timing import Throughput, median_run

__all__ = ["evaluate_targets", "machine_info", "markdown_table", "summarise", "targets_table"]


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
        if row is None or row.get(key) is None:
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
            add("bytes, workers 2, collate_bytes: >= 2x folder", 2.0, row, "vs_folder")
            for w in (0, 2):
                row = _find(rows, dataset=name, mode="decoded", workers=w, cache=cache)
                add("decoded: >= 0.97x in-memory decode", 0.97, row, "vs_memory")
    for row in rows:  # packer's LMDB reader against the plain py-lmdb reader, same setting
        if row["dataset"] != "lmdb":
            continue
        plain = _find(
            rows,
            dataset=PLAIN_LMDB,
            mode=row["mode"],
            workers=row["workers"],
            cache=row["cache"],
            collate=row["collate"],
        )
        if plain is not None and plain["images_per_s"] > 0:
            ratio = {"vs_plain": row["images_per_s"] / plain["images_per_s"]}
            add("lmdb: >= 1x plain py-lmdb reader", 1.0, {**row, **ratio}, "vs_plain")
    return checks


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}×"


def markdown_table(rows: Sequence[dict]) -> str:
    """The results as a markdown table."""
    head = ["dataset", "mode", "workers", "cache", "collate", "images/s", "MB/s", "× folder"]
    head += ["× memory", "spread", "CPU µs/img", "others' CPU"]
    return table(head, "llrllrrrrrrr", (_result_cells(r) for r in rows))


def _result_cells(r: dict) -> list[Any]:
    others = r["others_cpu_share"]
    return [
        r["dataset"], r["mode"], r["workers"], r["cache"], r["collate"],
        f"{r['images_per_s']:,.0f}", f"{r['mb_per_s']:,.0f}", _ratio(r["vs_folder"]),
        _ratio(r["vs_memory"]), f"{100 * r['spread']:.0f}%", f"{r['cpu_us_per_image']:,.0f}",
        "" if others is None else f"{100 * others:.0f}%",
    ]  # fmt: skip


def targets_table(checks: Sequence[dict]) -> str:
    """The target checks as a markdown table."""
    head = ["target", "dataset", "workers", "cache", "collate", "ratio", "met"]
    cells = (
        [c["target"], c["dataset"], c["workers"], c["cache"], c["collate"], f"{c['ratio']:.2f}×"]
        + ["yes" if c["met"] else "**no**"]
        for c in checks
    )
    return table(head, "llrllrl", cells)


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
