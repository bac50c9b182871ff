"""Medians, the issue's target ratios and the markdown table of ``benchmarks/remote.py``."""

from __future__ import annotations

import argparse
import statistics
from typing import Any

__all__ = ["summarize", "table"]


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _epoch(runs: list[dict[str, Any]], which: str, key: str) -> float | None:
    return _median([r[which][key] for r in runs if "error" not in r])


def _row(name: str, runs: list[dict[str, Any]], size: int) -> dict[str, Any]:
    good = [r for r in runs if "error" not in r]
    row: dict[str, Any] = {"config": name, "runs": len(runs), "errors": len(runs) - len(good)}
    if not good:
        row["error"] = runs[-1].get("error", "") if runs else "not run"
        return row
    row["open_s"] = _median([r["open_s"] for r in good])
    row["store_cpu_s"] = {  # the server's and the proxy's, over the whole pass (both epochs)
        k: _median([r["store_cpu_s"][k] for r in good if "store_cpu_s" in r])
        for k in ("server", "proxy")
    }
    for which in ("cold", "warm"):
        row[which] = {
            "images_per_s": _epoch(good, which, "images_per_s"),
            "images_per_s_runs": [r[which]["images_per_s"] for r in good],
            "images": _epoch(good, which, "images"),
            "seconds": _epoch(good, which, "seconds"),
            "traffic_ratio": (_epoch(good, which, "body_bytes") or 0) / size,
            "gets": _epoch(good, which, "gets"),
            "cpu_s": _epoch(good, which, "cpu_s"),
            "first_batch_s": _epoch(good, which, "first_batch_s"),
        }
    return row


def _rate(rows: dict[str, dict[str, Any]], name: str, which: str) -> float | None:
    row = rows.get(name)
    return None if row is None or which not in row else row[which]["images_per_s"]


def _targets(rows: dict[str, dict[str, Any]], configs: dict, sizes: dict, args: Any) -> dict:
    peers = [_rate(rows, n, "cold") for n in ("litdata, shuffle", "mds, shuffle")]
    best_peer = max((p for p in peers if p), default=None)
    cap = args.bandwidth_mbps * 1e6
    out: dict[str, Any] = {"best_peer_cold_shuffled": best_peer}
    for name, row in rows.items():
        reader, output, where, order, _ = configs[name]
        if reader != "packer" or where != "s3" or "cold" not in row:
            continue
        got: dict[str, Any] = {"traffic_cold": row["cold"]["traffic_ratio"]}
        if where == "s3" and order in ("sharded", "random") and best_peer:
            got["cold_vs_best_peer"] = row["cold"]["images_per_s"] / best_peer
        if where == "s3" and order == "sequential" and cap:
            per_image = sizes[output] / args.images
            got["cold_vs_cap"] = row["cold"]["images_per_s"] * per_image / cap
        local = _rate(rows, f"packer {output.split('.')[1]} local, {order}", "warm")
        if where == "s3" and local:
            got["warm_vs_local"] = row["warm"]["images_per_s"] / local
        out[name] = got
    return out


def summarize(
    results: dict[str, list[dict[str, Any]]],
    configs: dict[str, tuple[str, str, str, str, bool]],
    sizes: dict[str, int],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Per configuration, the medians over its runs; then the ratios the targets use."""
    rows = {n: _row(n, runs, sizes[configs[n][1]]) for n, runs in results.items()}
    return {"rows": rows, "targets": _targets(rows, configs, sizes, args)}


def _f(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def table(summary: dict[str, Any], args: argparse.Namespace) -> str:
    """The markdown table (medians) and the target ratios."""
    lines = [
        f"\n{args.images} images, latency {args.latency_ms:g} ms, cap {args.bandwidth_mbps:g} MB/s,"
        f" workers={args.workers}, batch={args.batch}, shards {args.shard_mb} MB\n",
        "| configuration | cold img/s | warm img/s | cold traffic ×| warm traffic × "
        "| cold GETs | cold CPU s | open s | cold 1st batch s | server/proxy CPU s |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for name, row in summary["rows"].items():
        if "cold" not in row:
            lines.append(f"| {name} | error: {row.get('error', '')[-120:]!r} |")
            continue
        c, w = row["cold"], row["warm"]
        lines.append(
            f"| {name} | {_f(c['images_per_s'], ',.0f')} | {_f(w['images_per_s'], ',.0f')} "
            f"| {c['traffic_ratio']:.3f} | {w['traffic_ratio']:.3f} | {_f(c['gets'], '.0f')} "
            f"| {_f(c['cpu_s'], '.1f')} | {_f(row['open_s'], '.2f')} "
            f"| {_f(c['first_batch_s'], '.2f')} "
            f"| {_f(row['store_cpu_s']['server'], '.1f')}/{_f(row['store_cpu_s']['proxy'], '.1f')} |"
        )
    lines.append("\n| packer configuration | cold ÷ best peer | cold ÷ cap | warm ÷ local |")
    lines.append("|---|--:|--:|--:|")
    for name, got in summary["targets"].items():
        if not isinstance(got, dict):
            continue
        lines.append(
            f"| {name} | {_f(got.get('cold_vs_best_peer'), '.2f')} "
            f"| {_f(got.get('cold_vs_cap'), '.2f')} | {_f(got.get('warm_vs_local'), '.2f')} |"
        )
    best = summary["targets"]["best_peer_cold_shuffled"]
    lines.append(f"\nbest peer, cold shuffled: {_f(best, ',.0f')} images/s")
    return "\n".join(lines)
