#!/usr/bin/env python
"""Writing to object storage: staging space and time of a conversion whose shards are uploaded
as they are checkpointed (``convert_to_url``'s default) against one that stages the whole
output and uploads it at the end (``keep_staging=True``, the behaviour before bounded staging),
with a local ``packer.convert`` of the same for reference (issue 21, item 6).

The photo-like set of ``--images`` JPEGs (``harness/throughput.py``) is converted to LMDB and to
NPY (``--shard-mb`` shards) into moto's S3 server on the loopback, through a proxy
(``harness/staging_proxy.py``) that holds each request ``--latency-ms`` and paces both
directions at ``--bandwidth-mbps`` (MB/s). Each run records its wall seconds, the peak of the
disk blocks held under its staging folder (a thread polling every 50 ms, and a sample at each
shard / tables / manifest event), the output's bytes, the bytes the proxy relayed upstream and
where the time went (``harness/staging_run.py``). Medians of ``--repeats`` rounds; in each
round the order of streamed and whole staging alternates. Run it with the benchmark venv::

    PYTHONPATH=$PWD /work/benchvenv/bin/python benchmarks/staging_stream.py --images 5000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.host_load import QuietWaiter, add_quiet_options
from harness.record import report_head, run_costs, save_report, stamped_log
from harness.staging_probe import WAYS, probe
from harness.staging_run import MODES, StagingStore, convert_once
from harness.throughput import prepare_images
from harness.throughput_report import machine_info

from packer.upload.stream import IN_FLIGHT, IN_FLIGHT_BYTES

FORMATS = {"lmdb": ".lmdb", "npy": ".npy"}
MB = 1e6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data"))
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--shard-mb", type=int, default=16)
    p.add_argument("--staging-limit-mb", type=int, default=None, help="default: four shards")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbps", type=float, default=50.0, help="MB/s each way; 0: no cap")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--formats",
        nargs="*",
        choices=list(FORMATS),
        default=list(FORMATS),
        help="none: probe only",
    )
    p.add_argument(
        "--probe-shards", type=int, default=8, help="shard-sized objects per upload probe; 0: none"
    )
    add_quiet_options(p, below=0.25, budget=30.0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/staging_stream.json"))
    return p.parse_args(argv)


def round_order(rep: int) -> list[str]:
    """Streamed and whole staging swap places every round; the local reference comes last."""
    pair = ["streamed", "whole"] if rep % 2 == 0 else ["whole", "streamed"]
    return [*pair, "local"]


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def phases(run: dict[str, Any]) -> dict[str, float]:
    """Where a run's wall time went: converting (until the tables event, the drain of the
    stream included), blocked on the staging limit, the upload thread busy / idle while
    converting, and the final upload (tables and manifests; the whole output when staged)."""
    t, ev = run["timings_s"], run["events_s"]
    converting = ev.get("tables", run["wall_s"])
    busy = t.get("upload_thread_busy", 0.0)
    return {
        "converting_s": converting,
        "blocked_on_limit_s": t.get("convert_blocked_after_shard", 0.0),
        "blocked_on_drain_s": t.get("convert_blocked_drain", 0.0),
        "upload_thread_busy_s": busy,
        "upload_thread_idle_s": max(0.0, converting - ev.get("shard", converting) - busy)
        if busy
        else 0.0,
        "final_upload_s": t.get("final_upload", 0.0),
        "after_manifest_s": run["wall_s"] - ev.get("manifest", run["wall_s"]),
    }


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Medians per format and mode, and the two ratios the issue asks about."""
    out: dict[str, Any] = {}
    for fmt, by_mode in results.items():
        rows: dict[str, Any] = {}
        for mode, runs in by_mode.items():
            row = {k: median(runs, k) for k in ("wall_s", "peak_staging_bytes", "sent_bytes")}
            row["output_bytes"] = median(runs, "output_bytes")
            row["peak_over_output"] = median(runs, "peak_over_output")
            per_phase = [phases(r) for r in runs]
            row["phases"] = {k: median(per_phase, k) for k in per_phase[0]} if runs else {}
            row["shards"] = median(runs, "shards")
            row["most_in_flight"] = max(
                (r["timings_most_at_once"].get("upload_thread_busy", 0) for r in runs), default=0
            )
            rows[mode] = row
        s, w = rows.get("streamed", {}), rows.get("whole", {})
        if s.get("wall_s") and w.get("wall_s"):
            rows["streamed_over_whole_wall"] = s["wall_s"] / w["wall_s"]
            pairs = zip(by_mode.get("streamed", []), by_mode.get("whole", []))
            rows["streamed_over_whole_per_round"] = [a["wall_s"] / b["wall_s"] for a, b in pairs]
        out[fmt] = rows
    return out


def probe_line(got: dict[str, Any]) -> str:
    return "; ".join(f"{way}: {r['mb_per_s']:.1f} MB/s" for way, r in got.items())


def table(summary: dict[str, Any], limit: int, shard: int) -> str:
    """The Markdown table of the README."""
    lines = [
        "| format | mode | wall s | peak staging MB | output MB | peak ÷ output | sent MB |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    formats = {k: v for k, v in summary.items() if k in FORMATS}
    for fmt, rows in formats.items():
        for mode in MODES:
            r = rows.get(mode)
            if not r or r["wall_s"] is None:
                continue
            sent = f"{r['sent_bytes'] / MB:.0f}" if mode != "local" else "–"
            lines.append(
                f"| {fmt} | {mode} | {r['wall_s']:.1f} | {r['peak_staging_bytes'] / MB:.0f} | "
                f"{r['output_bytes'] / MB:.0f} | {r['peak_over_output']:.2f} | {sent} |"
            )
    lines.append("")
    for fmt, rows in formats.items():
        out = rows.get("streamed", {}).get("output_bytes") or 0
        expected = (limit + 2 * shard) / out if out else float("nan")
        ratio = rows.get("streamed_over_whole_wall", float("nan"))
        rounds = rows.get("streamed_over_whole_per_round") or [float("nan")]
        lines.append(
            f"{fmt}: streamed ÷ whole wall {ratio:.2f} (per round {min(rounds):.2f}–"
            f"{max(rounds):.2f}); expected peak ÷ output "
            f"(limit + 2 shards) ÷ output = {expected:.2f}"
        )
    for way, r in summary.get("upload_probe", {}).items():
        lines.append(f"upload probe, {way}: {r['mb_per_s']:.1f} MB/s ({r['seconds']:.1f} s)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Prepare the images, start the store, run the rounds, print the table, write the JSON."""
    started = time.perf_counter()
    log = stamped_log(started)
    src, _ = prepare_images(args.data.resolve(), args.images, log, formats={})
    shard = args.shard_mb * 1_000_000
    limit = (args.staging_limit_mb or 4 * args.shard_mb) * 1_000_000
    options = {"shard_size": shard, "staging_limit": limit}
    scratch = args.data.resolve() / f"n{args.images}" / "staging-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    waiter = QuietWaiter(args.quiet_below, args.wait_budget)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        fmt: {m: [] for m in MODES} for fmt in args.formats
    }
    load_before = os.getloadavg()
    probes: list[dict[str, Any]] = []
    with StagingStore(args.latency_ms, args.bandwidth_mbps, scratch / "store") as store:
        for rep in range(args.repeats):
            for fmt in args.formats:
                for mode in round_order(rep):
                    waiter.wait()
                    cpu = store.cpu()
                    got = convert_once(mode, src, FORMATS[fmt], store, scratch, options)
                    got["store_cpu_s"] = {k: v - cpu[k] for k, v in store.cpu().items()}
                    got["loadavg"] = os.getloadavg()
                    results[fmt][mode].append(got)
                    log(
                        f"[{rep + 1}/{args.repeats}] {fmt} {mode}: {got['wall_s']:.1f} s, peak "
                        f"{got['peak_staging_bytes'] / MB:.0f} MB of "
                        f"{got['output_bytes'] / MB:.0f} MB, sent {got['sent_bytes'] / MB:.0f} MB"
                    )
            if args.probe_shards:
                probes.append(probe(store, scratch, shard, args.probe_shards))
                log(f"[{rep + 1}/{args.repeats}] upload probe: {probe_line(probes[-1])}")
    shutil.rmtree(scratch, ignore_errors=True)
    summary = summarize(results)
    summary["upload_probe"] = {
        way: {k: median([p[way] for p in probes], k) for k in ("seconds", "mb_per_s")}
        for way in (WAYS if probes else ())
    }
    print(table(summary, limit, shard))
    report = report_head("staging_stream", machine_info(), args)
    report.update(run_costs(started, waiter.waited, load_before, os.getloadavg()))
    report["stream"] = {"in_flight": IN_FLIGHT, "in_flight_bytes": IN_FLIGHT_BYTES}
    report.update(summary=summary, results=results, upload_probes=probes)
    save_report(args.out, report, indent=1)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
