#!/usr/bin/env python
"""What a spawned DataLoader worker pays to start: the dataset pickled into it, side by side.

For datasets of ``--samples`` one-byte images (``tests/tiny_dataset.py``: packer's own table
writers, one shard), each pickled as a DataLoader under spawn or forkserver pickles it, is sent
through a pipe to a process of the ``spawn`` start method, which unpickles it and reads one
sample. Three payloads, side by side in one run:

- ``small``: ``pickle.dumps(dataset)`` as packer pickles it (paths, options and the tables'
  identity; the worker maps the tables itself and checks them);
- ``whole``: the dataset's whole ``__dict__`` pickled (its tables, manifest and reader inside):
  what packer pickled before the datasets pickled small;
- ``baseline``: the dataset's class alone (the same interpreter and imports, no dataset).

Per payload: ``first_answer_s``, from ``Process.start()`` to the first sample (interpreter,
imports, transfer, unpickling; noisy: dominated by importing torch), and, the median of
``--repeats`` payloads sent to that same worker, ``dataset_s`` (transfer, unpickling, one
sample, timed by the parent: the dataset's own share of a worker's start-up) and
``unpickle_and_read_s`` (timed in the worker). ``whole_over_small`` is the ratio of the
``dataset_s``. Prints and writes one JSON object.

``--where url`` serves the datasets over HTTP on the loopback (``tests/bounds_servers``, Range
requests): ``small`` then fetches the manifest and tables again in the worker, ``whole`` carries
them in its pickle.

Usage::

    python benchmarks/pickle_startup.py --samples 10000 100000 1000000 --where local url
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from bounds_servers import file_server  # noqa: E402
from tiny_dataset import write_tiny  # noqa: E402

import packer  # noqa: E402


def _rebuild_whole(cls: type, state: dict[str, Any]) -> Any:
    dataset = cls.__new__(cls)
    dataset.__dict__.update(state)
    return dataset


class Whole:
    """A dataset pickled with its whole ``__dict__`` (its tables inside), as before."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __reduce__(self) -> Any:
        return _rebuild_whole, (type(self.dataset), dict(self.dataset.__dict__))


def _worker(requests: Any, answers: Any) -> None:
    """Import what a dataset's unpickling imports, then, per request, unpickle the dataset
    sent and read one sample."""
    import packer.read.datasets  # noqa: F401  (torch, numpy: the baseline's imports)

    answers.send("ready")
    while payload := requests.recv_bytes():
        began = time.perf_counter()
        dataset = pickle.loads(payload)
        if not isinstance(dataset, type):
            dataset[5]
        answers.send(time.perf_counter() - began)


def spawn_session(payload: bytes, repeats: int) -> tuple[float, list[float], list[float]]:
    """One spawned process: seconds from its start to its first answer (interpreter, imports,
    the payload's transfer, unpickling, one sample), then ``repeats`` more payloads, each
    timed by the parent (transfer, unpickling, one sample) and by the worker (unpickling and
    one sample)."""
    ctx = mp.get_context("spawn")
    requests, theirs = ctx.Pipe(duplex=False)
    ours, answers = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_worker, args=(requests, answers))
    began = time.perf_counter()
    process.start()
    ours.recv()
    theirs.send_bytes(payload)
    ours.recv()
    first = time.perf_counter() - began
    sent, inside = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        theirs.send_bytes(payload)
        inside.append(ours.recv())
        sent.append(time.perf_counter() - began)
    theirs.send_bytes(b"")
    process.join()
    if process.exitcode != 0:
        raise RuntimeError(f"worker exited with {process.exitcode}")
    return first, sent, inside


def measure(n: int, data: Path, repeats: int, endpoint: str | None = None) -> dict[str, Any]:
    root = data / f"tiny-{n}.npy"
    shutil.rmtree(root, ignore_errors=True)
    write_tiny(root, n)
    where = f"{endpoint}/{root.name}" if endpoint else root
    dataset = packer.open_dataset(where, output="bytes")
    payloads = {"baseline": type(dataset), "small": dataset, "whole": Whole(dataset)}
    out: dict[str, Any] = {"samples": n, "where": "url" if endpoint else "local"}
    for mode, payload in payloads.items():
        data = pickle.dumps(payload)
        first, sent, inside = spawn_session(data, repeats)
        out[mode] = {
            "pickled_bytes": len(data),
            "first_answer_s": round(first, 4),
            "dataset_s": round(statistics.median(sent), 5),
            "unpickle_and_read_s": round(statistics.median(inside), 5),
        }
    out["whole_over_small"] = round(
        out["whole"]["dataset_s"] / max(out["small"]["dataset_s"], 1e-6), 1
    )
    shutil.rmtree(root, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--where", nargs="+", choices=("local", "url"), default=["local"])
    parser.add_argument("--data", type=Path, default=Path("/tmp/packer-pickle-startup"))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "pickle_startup.json")
    args = parser.parse_args(argv)
    args.data.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    result = {
        "benchmark": "pickle_startup",
        "commit": commit,
        "machine": f"{platform.machine()}, {mp.cpu_count()} CPUs, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "start_method": "spawn",
        "repeats": args.repeats,
        "runs": [],
    }
    for where in args.where:
        if where == "local":
            result["runs"] += [measure(n, args.data, args.repeats) for n in args.samples]
            continue
        with file_server(args.data) as served:
            result["runs"] += [
                measure(n, args.data, args.repeats, served.endpoint) for n in args.samples
            ]
    text = json.dumps(result, indent=1)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
