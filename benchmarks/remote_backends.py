#!/usr/bin/env python
"""packer's two read backends side by side (issue 21, item 1: "a faster backend behind the
same interface only where a benchmark shows it pays"): the same NPY output read by ranged GETs
through s3fs (``storage_options={"backend": "fsspec"}``) and through obstore (``"obstore"``),
from the loopback store of ``benchmarks/remote.py`` (the file server behind the proxy, which
adds ``--latency-ms`` per request; ``--bandwidth-mbps`` caps the link, 0: none).

Every pass runs in a fresh process (``harness/remote_pass.py``): open, then two epochs through
``DataLoader(num_workers=--workers, batch_size=--batch)`` (fork, the Linux default; the open's
metadata goes through fsspec, so the workers read through obstore), no cache, so both epochs
read the store ("cold" and "again"). Passes are interleaved (every configuration once, then
again) and the medians reported with obstore ÷ fsspec ratios of images/s and of the reader's
CPU seconds (the main process and its workers)::

    PYTHONPATH=$PWD /work/benchvenv/bin/python benchmarks/remote_backends.py --images 2000
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

from harness.record import report_head, save_report, stamped_log
from harness.remote_data import tree_bytes
from harness.remote_s3 import LoopbackStore
from harness.throughput import prepare_images
from harness.throughput_report import machine_info
from remote import run_pass

import packer

BACKENDS = ("fsspec", "obstore")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data"))
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--shard-mb", type=int, default=16)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbps", type=float, default=0.0, help="MB/s; 0: no cap")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--orders", nargs="+", default=["random", "sharded", "sequential"])
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per pass")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/remote_backends.json"))
    return p.parse_args(argv)


def prepare(root: Path, images: int, shard_mb: int, log: Any) -> Path:
    """The photo-like JPEG set of the other benchmarks packed as NPY (made when missing)."""
    src, _ = prepare_images(root, images, log, formats={})
    dst = root / f"n{images}" / f"backends-{shard_mb}MB" / "packer.npy"
    if not (dst / "packer.json").is_file():
        log(f"writing {dst} ...")
        dst.parent.mkdir(parents=True, exist_ok=True)
        packer.convert(src, dst, shard_size=shard_mb << 20, overwrite=True, progress=False)
    return dst


def summarize(results: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Medians per configuration (``order/backend``) over its passes."""
    out = {}
    for name, runs in results.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            out[name] = {"error": 1.0}
            continue
        med = statistics.median
        out[name] = {
            "cold_images_per_s": med(r["cold"]["images_per_s"] for r in ok),
            "again_images_per_s": med(r["warm"]["images_per_s"] for r in ok),
            "cold_cpu_s": med(r["cold"]["cpu_s"] for r in ok),
            "first_batch_s": med(r["cold"]["first_batch_s"] for r in ok),
            "gets": med(r["cold"]["gets"] for r in ok),
            "passes": float(len(ok)),
        }
    return out


def table(summary: dict[str, dict[str, float]], orders: list[str]) -> str:
    lines = [
        f"{'order':11s} {'backend':8s} {'cold img/s':>10s} {'again img/s':>11s} "
        f"{'cold CPU s':>10s} {'1st batch s':>11s} {'GETs':>6s}"
    ]
    for order in orders:
        for b in BACKENDS:
            s = summary[f"{order}/{b}"]
            if "error" in s:
                lines.append(f"{order:11s} {b:8s} (failed)")
                continue
            lines.append(
                f"{order:11s} {b:8s} {s['cold_images_per_s']:10.0f} {s['again_images_per_s']:11.0f} "
                f"{s['cold_cpu_s']:10.1f} {s['first_batch_s']:11.2f} {s['gets']:6.0f}"
            )
        f, o = summary[f"{order}/fsspec"], summary[f"{order}/obstore"]
        if "error" not in f and "error" not in o:
            lines.append(
                f"{order:11s} {'ratio':8s} {o['cold_images_per_s'] / f['cold_images_per_s']:10.2f} "
                f"{o['again_images_per_s'] / f['again_images_per_s']:11.2f} "
                f"{o['cold_cpu_s'] / f['cold_cpu_s']:10.2f}"
            )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Prepare, serve, measure (interleaved), print the table, write the JSON."""
    started = time.perf_counter()
    log = stamped_log(started)
    root = args.data.resolve()
    local = prepare(root, args.images, args.shard_mb, log)
    scratch = root / f"n{args.images}" / "backends-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    names = [f"{o}/{b}" for o in args.orders for b in BACKENDS]
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    load = [os.getloadavg()]
    with LoopbackStore(args.latency_ms, args.bandwidth_mbps, scratch / "store") as store:
        url = store.upload(local, "packer.npy")
        for rep in range(args.repeats):
            for name in names if rep % 2 == 0 else names[::-1]:
                order, backend = name.split("/")
                cfg = {
                    "reader": "packer",
                    "source": url,
                    "endpoint": store.endpoint,
                    "order": order,
                    "cache_dir": None,
                    "workers": args.workers,
                    "batch": args.batch,
                    "storage_options": {"backend": backend},
                }
                got = run_pass(cfg, args.timeout)
                results[name].append(got)
                load.append(os.getloadavg())
                brief = got.get("error", "")[-300:] or (
                    f"cold {got['cold']['images_per_s']:.0f}/s "
                    f"({got['cold']['cpu_s']:.1f} CPU s), again {got['warm']['images_per_s']:.0f}/s"
                )
                log(f"[{rep + 1}/{args.repeats}] {name}: {brief}")
    summary = summarize(results)
    print(table(summary, args.orders))
    report = report_head("remote_backends", machine_info(), args)
    report.update(
        dataset_bytes=tree_bytes(local),
        loadavg=load,
        seconds_total=time.perf_counter() - started,
        summary=summary,
        results=results,
    )
    save_report(args.out, report, indent=1)
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
