#!/usr/bin/env python
"""Decode + RandomResizedCrop(224) + flip at the cores' ceiling? Issue 31, item 1, in one run.

Builds (or reuses) ``--images`` photo-like 400×350 JPEGs under ``--data`` and their LMDB, then
times the training transform (``packer.transforms.RandomResizedCrop(224)`` on the stored
bytes, a random horizontal flip, uint8 3×224×224 out) in three ways, each in a fresh process
whose ``PYTHONPATH`` is a checkout of packer — ``--baseline`` (a git revision or a folder: the
commit before the change) and ``--checkout`` (default: this one) — rounds alternating between
the two:

- ``one``: one process, ``ds[i]`` over a shuffled order (what one core does);
- ``ceiling``: ``--workers`` such processes at once, each over its share of the images,
  started together: what the machine's cores do when nothing but this work runs on them;
- ``loader``: ``DataLoader(num_workers=--workers, batch_size=64, shuffle=True)``, the default
  collate into one uint8 batch, second epoch of persistent workers timed.

Page cache warm (every file read first). Prints each row's median images/s and the targets:
``loader`` ≥ 0.9 × workers × ``one`` and ``one`` ≥ 1.3 × the baseline's. Writes
``--out``/training_path.json.

    python benchmarks/training_path.py --baseline 1f493af
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness.record import save_report
from harness.throughput_report import machine_info

ROOT = Path(__file__).resolve().parents[1]

PASS = r"""
import sys, time, numpy as np, torch
import packer
from packer.transforms import RandomResizedCrop
mode, dataset, workers, start_at, part, parts = sys.argv[1:7]
workers, start_at, part, parts = int(workers), float(start_at), int(part), int(parts)
torch.set_num_threads(1)
crop = RandomResizedCrop(224)

def transform(data):
    image = crop(data)
    return image.flip(-1) if torch.rand(1).item() < 0.5 else image

ds = packer.open_dataset(dataset, output="bytes", transform=transform)
order = np.random.default_rng(part).permutation(len(ds))[part::parts].tolist()
if mode == "one":
    for i in order[:64]:
        ds[i]  # warm: decoder libraries loaded, the environment open
    while time.time() < start_at:
        time.sleep(0.001)
    t = time.time()
    for i in order:
        ds[i]
    print(len(order), t, time.time(), packer.__file__)
else:
    loader = torch.utils.data.DataLoader(
        ds, batch_size=64, shuffle=True, num_workers=workers, persistent_workers=True
    )
    for _ in loader:
        pass  # the first epoch starts the workers
    t, n = time.time(), 0
    for images, _labels in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 224, 224)
        n += len(images)
    print(n, t, time.time(), packer.__file__)
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2500)
    parser.add_argument("--data", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--baseline", required=True, help="git revision or checkout folder")
    parser.add_argument("--checkout", type=Path, default=ROOT)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--start-delay", type=float, default=4.0, help="seconds for the processes to get ready"
    )
    return parser.parse_args(argv)


def dataset(data: Path, images: int) -> Path:
    """``data/n<images>/train.lmdb``: photo-like 400×350 JPEGs in 10 classes, packed once."""
    import packer
    from packer.demo.image import make_image_tree

    folder = data / f"n{images}"
    out = folder / "train.lmdb"
    if not (out / "packer.json").is_file():
        tree = folder / "images"
        if not tree.is_dir():
            per_class = max(1, images // 10)
            make_image_tree(tree, classes=10, per_class=per_class, size=(400, 350), bad=0)
        packer.convert(tree, out, overwrite=True, progress=False)
    for path in out.iterdir():  # warm the page cache
        path.read_bytes()
    return out


@contextmanager
def checkout_of(baseline: str):  # type: ignore[no-untyped-def]
    """A folder holding packer at ``baseline``: the folder itself, or a git worktree of it."""
    if Path(baseline).is_dir():
        yield Path(baseline)
        return
    with tempfile.TemporaryDirectory(prefix="packer-baseline-") as tmp:
        where = Path(tmp) / "tree"
        git = ["git", "-C", str(ROOT)]
        subprocess.run(
            [*git, "worktree", "add", "-q", "--detach", str(where), baseline], check=True
        )
        try:
            yield where
        finally:
            subprocess.run([*git, "worktree", "remove", "--force", str(where)], check=False)


def _start(checkout: Path, mode: str, data: Path, workers: int, start_at: float, part: int,
           parts: int) -> subprocess.Popen[str]:  # fmt: skip
    env = dict(os.environ, PYTHONPATH=f"{checkout}")  # -P: not the working folder's packer
    args = [mode, str(data), str(workers), str(start_at), str(part), str(parts)]
    return subprocess.Popen(
        [sys.executable, "-P", "-c", PASS, *args], env=env, stdout=subprocess.PIPE, text=True
    )


def measure(checkout: Path, row: str, data: Path, workers: int, delay: float = 4.0) -> float:
    """Images/s of one row, in fresh processes."""
    parts = workers if row == "ceiling" else 1
    mode = "loader" if row == "loader" else "one"
    start_at = time.time() + delay  # after every process has imported and warmed up
    procs = [_start(checkout, mode, data, workers, start_at, p, parts) for p in range(parts)]
    outs = []
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"{row} in {checkout} failed (exit {proc.returncode})")
        *numbers, module = out.split()
        if not Path(module).resolve().is_relative_to(checkout.resolve()):
            raise SystemExit(f"{row} imported {module}, not the checkout {checkout}")
        outs.append([float(v) for v in numbers])
    count = sum(o[0] for o in outs)
    return count / (max(o[2] for o in outs) - min(o[1] for o in outs))


def verdicts(rates: dict[str, dict[str, float]], workers: int) -> list[dict[str, Any]]:
    new, old = rates["checkout"], rates["baseline"]
    rows = [
        ("loader / (workers × one)", new["loader"] / (workers * new["one"]), 0.9),
        ("one / baseline one", new["one"] / old["one"], 1.3),
        ("loader / baseline loader", new["loader"] / old["loader"], None),
        ("ceiling / (workers × one)", new["ceiling"] / (workers * new["one"]), None),
        ("loader / ceiling", new["loader"] / new["ceiling"], None),
    ]
    return [
        {"measure": m, "ratio": r, "target": t, "met": None if t is None else r >= t}
        for m, r, t in rows
    ]


def main(args: argparse.Namespace) -> int:
    data = dataset(args.data, args.images)
    rows = ("one", "ceiling", "loader")
    runs: dict[str, dict[str, list[float]]] = {
        k: {r: [] for r in rows} for k in ("baseline", "checkout")
    }
    with checkout_of(args.baseline) as base:
        trees = {"baseline": base, "checkout": args.checkout.resolve()}
        for round_ in range(args.rounds):
            for name, tree in trees.items():
                for row in rows:
                    runs[name][row].append(measure(tree, row, data, args.workers, args.start_delay))
                    print(
                        f"round {round_ + 1} {name:8} {row:8} {runs[name][row][-1]:7,.0f} images/s"
                    )
    rates = {k: {r: statistics.median(v) for r, v in rs.items()} for k, rs in runs.items()}
    print(
        f"\n| checkout | one process | {args.workers} processes at once | DataLoader({args.workers}) |"
    )
    print("|---|--:|--:|--:|")
    for name in ("baseline", "checkout"):
        r = rates[name]
        print(f"| {name} | {r['one']:,.0f} | {r['ceiling']:,.0f} | {r['loader']:,.0f} |")
    print()
    results = verdicts(rates, args.workers)
    for v in results:
        target = (
            ""
            if v["target"] is None
            else f" (target ≥ {v['target']}: {'met' if v['met'] else 'missed'})"
        )
        print(f"{v['measure']}: {v['ratio']:.2f}{target}")
    if args.out is not None:
        report = {"machine": machine_info(), "images": args.images, "workers": args.workers,
                  "baseline": args.baseline, "runs": runs, "rates": rates, "verdicts": results}  # fmt: skip
        save_report(args.out / "training_path.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
