"""The tables of the clip benchmark (``harness.clip_bench``): markdown per mode, the
dataset-opening costs and the issue's targets, from the rows ``clip_bench.run`` returns."""

from __future__ import annotations

import statistics
from typing import Any

from harness.clip_bench import FOLDER
from packer.bench.bench_report import markdown_table as table

__all__ = ["markdown", "open_text", "targets_text"]


def _row(rows: list[dict[str, Any]], name: str, mode: str, w: int, cache: str) -> dict[str, Any]:
    for r in rows:
        if (r["dataset"], r["mode"], r["workers"], r["cache"]) == (name, mode, w, cache):
            return r
    return {}


def markdown(rows: list[dict[str, Any]], names: list[str], workers: list[int], mode: str,
             cache: str) -> str:  # fmt: skip
    """One table: a row per dataset, per ``num_workers`` clips/s, × frames and disk KB/clip."""
    head = ["dataset", "payload KB/clip"]
    head += [c for w in workers for c in (f"w={w} clips/s", "× frames", "disk KB/clip")]
    body = []
    for name in names:
        found = [_row(rows, name, mode, w, cache) for w in workers]
        if any(found):
            body.append([name, *_clip_cells(found)])
    return f"**{mode}, {cache} cache**\n\n" + table(
        [*head, "disk ÷ payload"], "l" + "r" * (len(head)), body
    )


def _clip_cells(found: list[dict[str, Any]]) -> list[str]:
    """payload KB/clip, then clips/s, × frames and disk KB/clip per worker count, then
    disk ÷ payload of each."""
    pay = next((r["payload_per_clip"] for r in found if r), None)
    cells = [f"{pay / 1e3:,.1f}" if pay else "–"]
    ratios = []
    for r in found:
        if not r:
            cells += ["–"] * 3
            continue
        cells += [f"{r['clips_per_s']:,.0f}", f"{r['x_folder']:.2f}",
                  f"{r['disk_per_clip'] / 1e3:,.1f}"]  # fmt: skip
        if r["disk_x_payload"] is not None:
            ratios.append(f"{r['disk_x_payload']:.2f}×")
    return [*cells, " / ".join(ratios) or "–"]


def open_text(rows: list[dict[str, Any]], names: list[str], workers: list[int]) -> str:
    """Constructing the fresh dataset (untimed above), and bytes-mode clips/s had it been timed."""
    settings = [(c, w) for c in ("cold", "warm") for w in workers]
    head = ["dataset", "open ms"]
    head += [t for c, w in settings for t in (f"{c} w={w} clips/s", "× frames")]

    def with_open(r: dict[str, Any]) -> float:
        return float(r["clips"] / (r["seconds"] + r["open_s"]))

    body = []
    base = [_row(rows, FOLDER, "bytes", w, c) for c, w in settings]
    for name in names:
        found = [_row(rows, name, "bytes", w, c) for c, w in settings]
        if not any(found):
            continue
        cells = [name, f"{statistics.median(r['open_s'] for r in found if r) * 1e3:,.1f}"]
        for r, b in zip(found, base):
            cells += (
                [f"{with_open(r):,.0f}", f"{with_open(r) / with_open(b):.2f}"]
                if r and b
                else ["–", "–"]
            )
        body.append(cells)
    return (
        "**fresh dataset construction** (outside the timed epoch above; bytes-mode clips/s and "
        "× frames if it were inside)\n\n" + table(head, "l" + "r" * (len(head) - 1), body)
    )


def targets_text(rows: list[dict[str, Any]], workers: list[int]) -> list[str]:
    """Issue 13's targets, each met or missed with its figures."""
    out = []

    def get(name: str, mode: str, w: int, cache: str) -> dict[str, Any]:
        return _row(rows, name, mode, w, cache)

    for name in ("npy", "h5", "lmdb"):
        figs = [get(name, "bytes", w, "cold") for w in workers]
        figs = [r for r in figs if r]
        if figs:
            worst = max(r["disk_x_payload"] for r in figs)
            out.append(
                f"cold bytes, disk ≤ 1.3× payload, {name}: "
                f"{'MET' if worst <= 1.3 else 'MISSED'} ("
                + ", ".join(f"w={r['workers']}: {r['disk_x_payload']:.2f}×" for r in figs)
                + ")"
            )
    for cache, label in (("cold", "cold bytes"), ("warm", "warm bytes")):
        for name in ("npy", "h5", "lmdb") + (("bmp",) if cache == "warm" else ()):
            figs = [r for r in (get(name, "bytes", w, cache) for w in workers) if r]
            if figs:
                worst = min(r["x_folder"] for r in figs)
                out.append(
                    f"{label}, clips/s ≥ 1.5× frame folders, {name}: "
                    f"{'MET' if worst >= 1.5 else 'MISSED'} ("
                    + ", ".join(f"w={r['workers']}: {r['x_folder']:.2f}×" for r in figs)
                    + ")"
                )
    for name in ("npy", "h5", "lmdb", "bmp"):
        figs = [r for c in ("warm", "cold") for w in workers
                if (r := get(name, "decoded", w, c))]  # fmt: skip
        if figs:
            worst = min(r["x_folder"] for r in figs)
            out.append(
                f"decoded, not slower than frame folders, {name}: "
                f"{'MET' if worst >= 1.0 else 'MISSED'} ("
                + ", ".join(f"{r['cache']} w={r['workers']}: {r['x_folder']:.2f}×" for r in figs)
                + ")"
            )
    return out
