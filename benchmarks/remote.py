#!/usr/bin/env python
"""Training from object storage: packer against LitData and MosaicML Streaming, all reading the
same photo-like JPEGs from one loopback S3 server behind a proxy that adds ``--latency-ms`` per
request and caps the bandwidth at ``--bandwidth-mbps`` (MB/s, one link shared by every
connection), and packer reading the same data from local disk (issue 21's benchmark).

Every configuration runs in a fresh process (``harness/remote_pass.py``) that opens the
dataset and reads two epochs through ``DataLoader(num_workers=--workers, batch_size=--batch)``:
cold (an empty cache folder) then warm (the cache as the first epoch left it). Repetitions are
interleaved (every configuration once, then again) and the medians reported, with images/s, the
bytes the proxy served per epoch over the dataset's bytes, and the ratios the issue's targets
use. Run it with the benchmark venv (``benchmarks/peers_env.sh``), which has the peers::

    PYTHONPATH=$PWD /work/benchvenv/bin/python benchmarks/remote.py --images 500 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness.record import report_head, save_report, stamped_log
from harness.remote_data import prepare, tree_bytes
from harness.remote_report import summarize, table
from harness.remote_s3 import LoopbackStore
from harness.throughput_report import machine_info

HERE = Path(__file__).resolve().parent
PASS = HERE / "harness" / "remote_pass.py"

# name: (reader, output, where, order, cache)  where: "s3" or "local"; cache: a cache folder
CONFIGS: dict[str, tuple[str, str, str, str, bool]] = {
    "packer npy ranged, sequential": ("packer", "packer.npy", "s3", "sequential", False),
    "packer npy ranged, sharded": ("packer", "packer.npy", "s3", "sharded", False),
    "packer npy ranged, random": ("packer", "packer.npy", "s3", "random", False),
    "packer npy cached, sequential": ("packer", "packer.npy", "s3", "sequential", True),
    "packer npy cached, sharded": ("packer", "packer.npy", "s3", "sharded", True),
    "packer npy cached, random": ("packer", "packer.npy", "s3", "random", True),
    "packer lmdb cached, sequential": ("packer", "packer.lmdb", "s3", "sequential", True),
    "packer lmdb cached, sharded": ("packer", "packer.lmdb", "s3", "sharded", True),
    "packer lmdb cached, random": ("packer", "packer.lmdb", "s3", "random", True),
    "packer npy ranged, random, 64 connections": ("packer", "packer.npy", "s3", "random", False),
    "litdata, sequential": ("litdata", "litdata", "s3", "sequential", True),
    "litdata, shuffle": ("litdata", "litdata", "s3", "shuffle", True),
    "mds, sequential": ("mds", "mds", "s3", "sequential", True),
    "mds, shuffle": ("mds", "mds", "s3", "shuffle", True),
    "packer npy local, sequential": ("packer", "packer.npy", "local", "sequential", False),
    "packer npy local, random": ("packer", "packer.npy", "local", "random", False),
    "packer npy local, sharded": ("packer", "packer.npy", "local", "sharded", False),
    "packer lmdb local, sequential": ("packer", "packer.lmdb", "local", "sequential", False),
    "packer lmdb local, random": ("packer", "packer.lmdb", "local", "random", False),
    "packer lmdb local, sharded": ("packer", "packer.lmdb", "local", "sharded", False),
}


# more storage options of a configuration: aiobotocore keeps at most 10 connections per client
# (botocore's max_pool_connections), so at most 10 of a batch's ranged GETs are in flight
EXTRA_OPTIONS = {
    "packer npy ranged, random, 64 connections": {"config_kwargs": {"max_pool_connections": 64}}
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data"))
    p.add_argument("--images", type=int, default=5000)
    p.add_argument("--shard-mb", type=int, default=16, help="shard / chunk size of every format")
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbps", type=float, default=50.0, help="MB/s; 0: no cap")
    p.add_argument("--server", choices=("files", "moto"), default="files")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=None)
    p.add_argument("--skip", nargs="+", default=[], help="leave out configs containing these")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per pass")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/remote.json"))
    return p.parse_args(argv)


def chosen(args: argparse.Namespace) -> list[str]:
    names = args.configs or list(CONFIGS)
    return [n for n in names if not any(s in n for s in args.skip)]


def run_pass(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One configuration in a fresh process; its JSON, or the error it ended with."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        done = subprocess.run(
            [sys.executable, str(PASS), json.dumps(cfg)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        return {"error": done.stderr.strip()[-2000:] or f"exit {done.returncode}"}
    return json.loads(lines[-1])


def main(args: argparse.Namespace) -> int:
    """Prepare, serve, measure, print the table, write the JSON."""
    started = time.perf_counter()
    log = stamped_log(started)
    root = args.data.resolve()
    _, outputs = prepare(root, args.images, args.shard_mb, log)
    sizes = {name: tree_bytes(path) for name, path in outputs.items()}
    scratch = root / f"n{args.images}" / "remote-scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    names = chosen(args)
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    load = [os.getloadavg()]
    with LoopbackStore(args.latency_ms, args.bandwidth_mbps, scratch / "store", args.server) as s:
        urls = {name: s.upload(path, name) for name, path in outputs.items()}
        for rep in range(args.repeats):
            for k, name in enumerate(names):
                reader, output, where, order, cached = CONFIGS[name]
                cache = scratch / f"cache-{rep}-{k}"
                cfg = {
                    "reader": reader,
                    "source": urls[output] if where == "s3" else str(outputs[output]),
                    "endpoint": s.endpoint if where == "s3" else None,
                    "order": order,
                    "cache_dir": str(cache) if cached else None,
                    "workers": args.workers,
                    "batch": args.batch,
                    "storage_options": EXTRA_OPTIONS.get(name, {}),
                }
                cpu = s.cpu()
                got = run_pass(cfg, args.timeout)
                got["store_cpu_s"] = {k: v - cpu[k] for k, v in s.cpu().items()}
                shutil.rmtree(cache, ignore_errors=True)
                results[name].append(got)
                load.append(os.getloadavg())
                brief = got.get("error", "")[-300:] or (
                    f"cold {got['cold']['images_per_s']:.0f}/s, "
                    f"warm {got['warm']['images_per_s']:.0f}/s, "
                    f"traffic {got['cold']['body_bytes'] / sizes[output]:.2f}x"
                )
                log(f"[{rep + 1}/{args.repeats}] {name}: {brief}")
    summary = summarize(results, CONFIGS, sizes, args)
    print(table(summary, args))
    report = report_head("remote", machine_info(), args)
    report.update(
        dataset_bytes=sizes,
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
