"""Bench results as markdown tables, JSON (with the machine and the command) and a PNG plot."""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from packer.bench.bench import RunResult
from packer.bench.storage_cost import StorageCost
from packer.core.cpus import available_cpus
from packer.errors import PackerError

__all__ = [
    "bench_json",
    "machine",
    "markdown_table",
    "plot_runs",
    "runs_table",
    "stalls_text",
    "storage_table",
    "write_json",
]


def markdown_table(head: Sequence[str], align: str, rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table, the one renderer of every bench and benchmark table.

    Args:
        head: the column titles.
        align: one letter a column: ``l`` left, ``r`` right (``---`` or ``--:`` in the rule).
        rows: each row's cells, one a column (rendered with ``str``).
    """
    if len(align) != len(head) or set(align) - {"l", "r"}:
        raise ValueError(f"align {align!r} must be one l or r for each of {len(head)} columns")
    rule = "|" + "|".join("--:" if a == "r" else "---" for a in align) + "|"
    lines = [_cells(head), rule]
    for row in rows:
        if len(row) != len(head):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(head)} columns")
        lines.append(_cells(row))
    return "\n".join(lines)


def _cells(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _pct(value: float | None) -> str:
    return "" if value is None else f"{100 * value:.0f} %"


def runs_table(runs: Sequence[RunResult]) -> str:
    """One row per configuration: throughput, ratio to the first path, per-batch waits."""
    head = ["dataset", "mode", "workers", "cache", "resident", "images/s", "MB/s", "× first"]
    head += ["wait p50 ms", "p95 ms", "max ms", "stall"]
    return markdown_table(head, "llrlrrrrrrrl", (_run_cells(r) for r in runs))


def _run_cells(r: RunResult) -> list[str]:
    w, stall = r.waits_summary(), r.stall()
    return [
        r.label, r.mode, str(r.workers), r.cache, _pct(r.resident_before),
        f"{r.images_per_s:,.0f}", f"{r.mb_per_s:,.1f}", "" if r.ratio is None else f"{r.ratio:.2f}×",
        f"{w.p50_ms:.1f}", f"{w.p95_ms:.1f}", f"{w.max_ms:.1f}",
        f"every {stall.period}" if stall.period else stall.kind,
    ]  # fmt: skip


def storage_table(costs: Sequence[StorageCost]) -> str:
    """Per-sample storage cost of each dataset, from the reading process's kernel counters.

    ``storage KB`` is what the disk delivered per sample (a clip, for video: ``read_bytes``);
    ``payload KB`` the stored bytes the sample hands back (a clip's sampled frames); ``stored
    KB`` the bytes the whole sample occupies (every frame of the video).
    """
    head = ["dataset", "cache", "samples", "files opened", "read syscalls", "storage KB"]
    head += ["payload KB", "storage ÷ payload", "major faults", "stored KB"]
    return markdown_table(head, "llrrrrrrrr", (_cost_cells(c) for c in costs))


def _cost_cells(c: StorageCost) -> list[str]:
    p = c.per_sample()
    return [
        c.label, f"cold ({_pct(c.resident_before)} resident)" if c.cold else "warm",
        f"{c.samples} {c.unit}s", f"{p['opens']:.3f}", f"{p['read_syscalls']:.2f}",
        f"{p['storage_bytes'] / 1e3:.1f}", f"{p['payload_bytes'] / 1e3:.1f}",
        f"{p['disk_per_payload']:.2f}×", f"{p['major_faults']:.3f}", f"{p['stored_bytes'] / 1e3:.1f}",
    ]  # fmt: skip


def stalls_text(runs: Sequence[RunResult]) -> list[str]:
    """One sentence per run whose waits show a periodic stall."""
    out = []
    for r in runs:
        stall = r.stall()
        if stall.kind != "periodic":
            continue
        text = (
            f"{r.label} {r.mode} workers={r.workers}: one slow batch every {stall.period} "
            f"({stall.slow_ms:.1f} ms against {stall.fast_ms:.1f} ms)"
        )
        if stall.period == r.workers:
            text += (
                " = num_workers: each worker builds a whole batch alone and the batches"
                " arrive in rounds; more workers (num_workers >= W / t) or cheaper samples"
                " remove the wait"
            )
        out.append(text)
    return out


def machine() -> dict[str, Any]:
    """Where the numbers come from."""
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpus": available_cpus(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def bench_json(
    runs: Sequence[RunResult],
    costs: Sequence[StorageCost],
    options: dict[str, Any],
    complete: bool = True,
) -> str:
    """Every run (with its per-batch waits), the storage costs, the machine and command, as
    JSON text (what ``packer bench --json`` prints and ``--json-out`` saves)."""
    data = {
        "machine": machine(),
        "command": " ".join(sys.argv),
        "options": options,
        "complete": complete,
        "runs": [r.to_dict() for r in runs],
        "storage": [c.to_dict() for c in costs],
    }
    return json.dumps(data, indent=2, default=str)


def write_json(
    path: str | os.PathLike[str],
    runs: Sequence[RunResult],
    costs: Sequence[StorageCost],
    options: dict[str, Any],
    complete: bool = True,
) -> None:
    """Save :func:`bench_json` to ``path``."""
    Path(path).write_text(bench_json(runs, costs, options, complete))


def plot_runs(path: str | os.PathLike[str], runs: Sequence[RunResult]) -> Any:
    """Images/s against num_workers, one line per (dataset, mode, cache), saved as a PNG.

    The y axis is logarithmic: bytes runs reach 10⁴-10⁵ images/s and decode runs 10²-10³, so
    on a linear axis the decode lines lie flat on zero. Returns the (closed) figure.

    Raises:
        PackerError: matplotlib is not installed (``pip install 'packer[plot]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PackerError("--plot needs matplotlib: pip install 'packer[plot]'") from exc
    series: dict[str, list[tuple[int, float]]] = {}
    for r in runs:
        series.setdefault(f"{r.label} {r.mode} {r.cache}", []).append((r.workers, r.images_per_s))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    ax.set_xlabel("num_workers")
    ax.set_yscale("log")
    ax.set_ylabel("images / s (log scale)")
    ax.set_title("DataLoader throughput per dataset and worker count")
    ax.set_xticks(sorted({r.workers for r in runs}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig
