#!/usr/bin/env python
"""The cost of checkpointing a torchdata StatefulDataLoader over packer: ``loader.state_dict()``
per call, the bytes of the state, and what torchdata's per-step snapshots add to a batch, with
``packer.ShardedSampler`` over a packed LMDB and over a ``packer.Mixture`` (that LMDB 3:1 with an
NPY output), ``num_workers`` 0 and 2, for small outputs and a 1,000,000-sample LMDB.

The small outputs are ``--images`` demo JPEGs (96×72) each; the large one is made once with
``harness.scale.make_packed`` (tiny JPEGs written straight through the LMDB writer, ~1 s per
100,000 samples; 1000 shards, one per 1000 samples for a smaller ``--large``). Batches hold raw bytes (no decode), so a batch is as cheap as packer
makes it and the state's share of it is an upper bound. Every setting runs ``--repeats`` times,
interleaved (every other round backwards); the tables give medians. See
``harness.stateful_cost`` for what one pass is.

Usage::

    python benchmarks/state_dict_cost.py --data /tmp/packer-state --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.record import report_head, save_report, stamped_log
from harness.scale import make_packed
from harness.stateful_cost import Config, one_pass, open_target, prepare_small, sampler_costs
from harness.throughput_report import machine_info

from packer.core.manifest import MANIFEST_NAME, load_manifest


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data/state"))
    p.add_argument("--images", type=int, default=400, help="samples of each small output")
    p.add_argument(
        "--large", type=int, default=1_000_000, help="samples of the large LMDB (0: none)"
    )
    p.add_argument("--batches", type=int, default=100, help="timed batches per pass")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/state_dict_cost.json"))
    return p.parse_args(argv)


def prepare(args: argparse.Namespace) -> dict[str, tuple[Path, Path]]:
    """``{size: (main output, extra output)}``."""
    small = prepare_small(args.data, args.images)
    sizes = {"small": (small["lmdb"], small["npy"])}
    if args.large:
        big = args.data / f"large{args.large}.lmdb"
        if not (big / MANIFEST_NAME).is_file() or load_manifest(big).num_samples != args.large:
            if big.exists():
                raise SystemExit(f"{big} exists but is not a {args.large}-sample output: remove it")
            make_packed(big, args.large, classes=1000, shards=max(1, min(1000, args.large // 1000)))
        sizes["1M" if args.large == 1_000_000 else f"{args.large:,}"] = (big, small["npy"])
    return sizes


def configs(sizes: list[str], workers: list[int]) -> list[Config]:
    """Every setting; with workers, also without per-step snapshots (the cost they add)."""
    out = []
    for size in sizes:
        for target in ("packed", "mixture"):
            for w in workers:
                out.append(Config(size, target, w, 1))
                if w:
                    out.append(Config(size, target, w, None))
    return out


def run(args: argparse.Namespace, log: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """All passes, interleaved; then the sampler-only costs of each dataset."""
    sizes = prepare(args)
    datasets = {(s, t): open_target(t, *sizes[s]) for s in sizes for t in ("packed", "mixture")}
    todo = configs(list(sizes), args.workers)
    runs: dict[Config, list[dict[str, Any]]] = {c: [] for c in todo}
    for round_number in range(args.repeats):
        for c in todo if round_number % 2 == 0 else todo[::-1]:
            result = one_pass(datasets[c.size, c.target], c, args.batches, args.batch_size)
            runs[c].append(result)
            log(f"round {round_number + 1} {c}: batch {1e3 * result['batch_s']:.2f} ms")
    rows = []
    for c, passes in runs.items():
        row: dict[str, Any] = {**c.__dict__, "passes": passes}
        for key in (
            "batch_s",
            "cpu_s_per_batch",
            "state_dict_s",
            "state_dict_max_s",
            "state_bytes",
        ):
            values = [p[key] for p in passes if p[key] is not None]
            row[key] = statistics.median(values) if values else None
        rows.append(row)
    samplers = [
        {"size": s, "target": t, "samples": len(ds), **sampler_costs(ds)}
        for (s, t), ds in datasets.items()
    ]
    return rows, samplers


def markdown(rows: list[dict[str, Any]], samplers: list[dict[str, Any]]) -> str:
    """The two tables of the README."""
    lines = [
        "| dataset | target | workers | batch (snapshots every step) | batch (no snapshots) | "
        "snapshot cost: time / CPU | `state_dict()` median / max | share of a batch | state bytes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    plain = {(r["size"], r["target"], r["workers"]): r for r in rows if r["snapshot_every"] is None}
    for r in (r for r in rows if r["snapshot_every"] == 1):
        bare = plain.get((r["size"], r["target"], r["workers"]))
        without = f"{1e3 * bare['batch_s']:.2f} ms" if bare else "—"
        ratio = (
            f"{r['batch_s'] / bare['batch_s']:.2f}× / "
            f"{r['cpu_s_per_batch'] / bare['cpu_s_per_batch']:.2f}×"
            if bare
            else "—"
        )
        lines.append(
            f"| {r['size']} | {r['target']} | {r['workers']} | {1e3 * r['batch_s']:.2f} ms | "
            f"{without} | {ratio} | {1e6 * r['state_dict_s']:.0f} / "
            f"{1e6 * r['state_dict_max_s']:.0f} µs | {100 * r['state_dict_s'] / r['batch_s']:.2f} % "
            f"| {r['state_bytes']} |"
        )
    lines += [
        "",
        "| dataset | target | samples | sampler blocks | `sampler.state_dict()` | state bytes | "
        "resume (load + first index) |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in samplers:
        lines.append(
            f"| {s['size']} | {s['target']} | {s['samples']:,} | {s['blocks']:,} | "
            f"{1e6 * s['sampler_state_dict_s']:.1f} µs | {s['sampler_state_bytes']} | "
            f"{1e3 * s['resume_first_index_s']:.1f} ms |"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Measure, print the tables, write the JSON."""
    started = time.perf_counter()
    rows, samplers = run(args, stamped_log(started))
    print(markdown(rows, samplers))
    report = report_head("state_dict_cost", machine_info(), args)
    save_report(args.out, {**report, "results": rows, "samplers": samplers}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
