"""Did a refactor slow reading? Warm shuffled reads of raw bytes and the open of a dataset, by two
checkouts of packer side by side in one run (issue 29: the move to sub-packages).

    python benchmarks/layout_regression.py DATASET --old /path/to/old/checkout --new .

Each pass runs in a fresh process with ``PYTHONPATH`` set to a checkout; passes alternate
old/new ``--rounds`` times; it prints each checkout's median images/s (best of 5 epochs per
pass, batches of 64 through ``__getitems__``) and median open time, and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

PASS = """
import sys, time, numpy as np, packer
ds = packer.open_dataset(sys.argv[1], output="bytes")
n = len(ds); order = np.random.default_rng(0).permutation(n); best = 0.0
for _ in range(5):
    t = time.perf_counter()
    for s in range(0, n, 64):
        ds.__getitems__(order[s:s + 64].tolist())
    best = max(best, n / (time.perf_counter() - t))
t = time.perf_counter(); packer.open_dataset(sys.argv[1]); opened = time.perf_counter() - t
print(best, opened, packer.__file__)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset")
    parser.add_argument("--old", required=True, help="the checkout before the change")
    parser.add_argument("--new", default=".", help="the checkout after it")
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args(argv)


def one_pass(checkout: str, dataset: str) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    out = subprocess.run(  # -P: sys.path starts with the checkout, not the working folder
        [sys.executable, "-P", "-c", PASS, dataset],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    if not os.path.realpath(out[2]).startswith(os.path.realpath(checkout) + os.sep):
        raise SystemExit(f"the pass imported {out[2]}, not the checkout {checkout}")
    return float(out[0]), float(out[1])


def main(args: argparse.Namespace) -> None:
    runs: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    for _ in range(args.rounds):
        for name in ("old", "new"):
            runs[name].append(one_pass(getattr(args, name), args.dataset))
    rate = {k: statistics.median(r for r, _ in v) for k, v in runs.items()}
    opened = {k: statistics.median(o for _, o in v) * 1e3 for k, v in runs.items()}
    for k in ("old", "new"):
        print(f"{k}: {rate[k]:,.0f} images/s, open {opened[k]:.2f} ms")
    print(
        f"new/old: reads {rate['new'] / rate['old']:.2f}x, open {opened['new'] / opened['old']:.2f}x"
    )


if __name__ == "__main__":
    main(parse_args())
