#!/usr/bin/env python
"""Encoded bytes from DataLoader workers to the training process, by two checkouts side by side
in one run: a class dataset with ``batch_buffer=True`` and ``collate_fn=packer.collate_bytes``,
and a dataset with fields (``fields=("jpg", "txt")``, ``output="bytes"``) with
``collate_fn=packer.collate_fields``.

    python benchmarks/transport.py CLASS_DATASET [FIELD_DATASET] --old /path/to/old --new .

Each pass runs in a fresh process with ``PYTHONPATH`` set to a checkout (``python -P``), page
cache warm, ``--epochs`` shuffled epochs of ``DataLoader(num_workers=--workers, batch 64)``, fresh
workers each epoch, the training process touching every page of every batch; it reports the
median samples/s of its epochs. Passes alternate old/new ``--rounds`` times; the script prints
each checkout's median and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

PASS = """
import json, pathlib, statistics, sys, time
import numpy as np, torch
from torch.utils.data import DataLoader, RandomSampler
import packer
path, kind, workers, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for p in pathlib.Path(path).rglob("*"):
    if p.is_file(): p.read_bytes()
if kind == "class":
    ds = packer.open_dataset(path, output="bytes", batch_buffer=True)
    collate = packer.collate_bytes
else:
    ds = packer.open_dataset(path, fields=("jpg", "txt"), output="bytes")
    collate = packer.collate_fields
rates = []
for epoch in range(epochs):
    torch.manual_seed(epoch)
    loader = DataLoader(ds, batch_size=64, sampler=RandomSampler(ds), num_workers=workers,
                        collate_fn=collate)
    start, n = time.perf_counter(), 0
    for batch in loader:
        if kind == "class":
            n += len(batch[2]); int(batch[0].numpy()[::4096].sum())
        else:
            n += len(batch[0])
            for image in batch[0]: int(np.frombuffer(image, np.uint8)[::4096].sum())
    assert n == len(ds), n
    rates.append(n / (time.perf_counter() - start))
print(json.dumps({"rate": statistics.median(rates), "packer": packer.__file__}))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("datasets", nargs="+", help="a class dataset, a dataset with fields")
    parser.add_argument("--old", required=True, help="the checkout before the change")
    parser.add_argument("--new", default=".", help="the checkout after it")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    return parser.parse_args(argv)


def one_pass(checkout: str, dataset: str, workers: int, epochs: int) -> float:
    """Median samples/s of one fresh process reading ``dataset`` with ``checkout``'s packer."""
    kind = "fields" if (json.loads(_manifest(dataset))["kind"] == "fields") else "class"
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    out = subprocess.run(
        [sys.executable, "-P", "-c", PASS, dataset, kind, str(workers), str(epochs)],
        env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    got = json.loads(out.strip().splitlines()[-1])
    if not os.path.realpath(got["packer"]).startswith(os.path.realpath(checkout) + os.sep):
        raise SystemExit(f"the pass imported {got['packer']}, not the checkout {checkout}")
    return float(got["rate"])


def _manifest(dataset: str) -> str:
    with open(os.path.join(dataset, "packer.json")) as fh:
        return fh.read()


def main(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    report: dict[str, dict[str, float]] = {}
    for dataset in args.datasets:
        runs: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.rounds):
            for name in ("old", "new"):
                runs[name].append(one_pass(getattr(args, name), dataset, args.workers, args.epochs))
        rate = {k: statistics.median(v) for k, v in runs.items()}
        report[dataset] = {**rate, "new/old": rate["new"] / rate["old"]}
        print(
            f"{dataset}: old {rate['old']:,.0f}, new {rate['new']:,.0f} samples/s "
            f"(rounds {[round(r) for r in runs['old']]} / {[round(r) for r in runs['new']]}); "
            f"new/old {rate['new'] / rate['old']:.2f}x"
        )
    return report


if __name__ == "__main__":
    main(parse_args())
