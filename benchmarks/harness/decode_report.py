"""Medians, ratios to the baseline, target checks and the markdown table of ``benchmarks/decode.py``."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from harness.decode_bench import BASELINE, Key, Row, Variant
from packer.bench.bench_report import markdown_table as table

__all__ = ["markdown_table", "summarise"]


def summarise(
    variants: Sequence[Variant],
    rows: Sequence[Row],
    runs: dict[Key, list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """One dict per (variant, row, workers): the median pass, ratios and the target check."""
    medians: dict[Key, dict[str, Any]] = {}
    for key, passes in runs.items():
        rates = sorted(p["images_per_s"] for p in passes)
        median = statistics.median(rates)
        middle = min(passes, key=lambda p: abs(p["images_per_s"] - median))
        medians[key] = {
            "images_per_s": median,
            "spread": (rates[-1] - rates[0]) / median if median else 0.0,
            "cpu_us_per_image": 1e6 * statistics.median(p["cpu_s"] / p["images"] for p in passes),
            "others_cpu_share": middle["others_cpu_share"],
            "output_bytes_per_image": middle["output_bytes_per_image"],
            "resident_before_min": min((p["resident_before"] or 0.0) for p in passes),
        }
    out = []
    for variant in variants:
        for (name, row_name, w), m in medians.items():
            if name != variant.name:
                continue
            row = next(r for r in rows if r.name == row_name)
            base = medians.get((name, BASELINE, w))
            versus = medians.get((name, row.versus, w))
            ratio = m["images_per_s"] / base["images_per_s"] if base else None
            target_ratio = m["images_per_s"] / versus["images_per_s"] if versus else None
            out.append(
                {
                    "variant": name,
                    "source_size": list(variant.size),
                    "images": variant.images,
                    **asdict(row),
                    "workers": w,
                    **m,
                    "x_baseline": ratio,
                    "x_versus": target_ratio,
                    "met": None
                    if row.target is None or target_ratio is None
                    else target_ratio >= row.target,
                    "passes": runs[(name, row_name, w)],
                }
            )
    return out


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}×"


def markdown_table(results: Sequence[dict[str, Any]]) -> str:
    """The results as a markdown table (medians, ratios, targets)."""
    head = ["images", "row", "stored", "decoder", "method", "workers", "images/s", "× baseline"]
    head += ["target", "met", "spread", "CPU µs/img", "others' CPU"]
    return table(head, "lllllrrrllrrr", (_result_cells(r) for r in results))


def _result_cells(r: dict[str, Any]) -> list[Any]:
    target = "-"
    if r["target"] is not None:
        versus = "baseline" if r["versus"] == BASELINE else r["versus"]
        target = f"≥ {r['target']:g}× {versus} ({_x(r['x_versus'])})"
    met = "-" if r["met"] is None else ("met" if r["met"] else "**missed**")
    others = r["others_cpu_share"]
    return [
        f"{r['images']}×{r['source_size'][0]}x{r['source_size'][1]}", r["name"], r["store"],
        r["decoder"], r["method"], r["workers"], f"{r['images_per_s']:,.0f}",
        _x(r["x_baseline"]), target, met, f"{100 * r['spread']:.0f}%",
        f"{r['cpu_us_per_image']:,.0f}", "-" if others is None else f"{100 * others:.0f}%",
    ]  # fmt: skip
