#!/usr/bin/env python
"""Shuffled cold reads (issue 23 item 3): one ``RandomSampler`` epoch of raw bytes
(``output="bytes"``) of the JPEG folder and its packed copies, cold page cache, interleaved.

Every pass runs in a freshly forked child: the dataset's data files are evicted
(``POSIX_FADV_DONTNEED`` after ``sync``), one shuffled epoch is timed through a DataLoader
(batch ``--batch-size``, ``num_workers`` each of ``--workers``), and the pages of the data files
in the page cache afterwards (``mincore``) tell the bytes read from disk for the epoch (every
page was evicted before: a resident page was read during the pass, readahead included).

``--variants`` picks reader policies for the packed copies:

- ``asis``: the readers as they are (``open_dataset`` defaults: NPY/HDF5 image shards are
  asked for whole at their first touch when the dataset fits half of ``MemAvailable``);
- ``before``: NPY/HDF5 shards left to the kernel's readahead around each fault (the readers
  before that policy);
- ``patched``: a whole shard asked for at its first touch in each process, patched into the
  readers (``POSIX_FADV_WILLNEED`` window by window), LMDB included;
- ``thread``: NPY/HDF5 as ``patched`` but the requests issued by a background thread (reads
  overlap their submission);
- ``random``: ``readahead=False``: only the pages touched are read (the exact-read path);
- ``warm``, ``before-warm``: as ``asis``, ``before`` with the files read into the page cache
  just before the pass.

Usage::

    python benchmarks/shuffled_cold.py --src DIR --outputs A.npy B.h5 C.lmdb --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from harness.forked import in_child
from harness.throughput import prewarm, resident_all

import packer
from packer.diagnosis.targets import close_dataset, data_files, evict_page_cache
from packer.diagnosis.timing import measure_throughput


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--src", type=Path, required=True, help="the JPEG folder")
    p.add_argument("--outputs", type=Path, nargs="+", required=True, help="packed copies")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    p.add_argument("--variants", nargs="+", default=["asis", "willneed"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="JSON file of every pass")
    return p.parse_args(argv)


def _options(path: Path, variant: str) -> dict[str, Any]:
    if variant in ("asis", "patched", "warm", "before", "before-warm", "thread"):
        return {}
    if variant == "random":
        return {"readahead": False}
    raise SystemExit(
        f"unknown variant {variant!r}: asis, before, patched, thread, random, warm or before-warm"
    )


def _willneed(fd: int, chunk: int = 8 << 20) -> None:
    """WILLNEED in chunks: the kernel caps one call at the device's readahead size."""
    size = os.fstat(fd).st_size
    for start in range(0, size, chunk):
        os.posix_fadvise(fd, start, min(chunk, size - start), os.POSIX_FADV_WILLNEED)


def _patch_willneed() -> None:
    """WILLNEED over each shard at its first open, patched into the readers (how the policy was
    measured before it existed; LMDB still has no such policy)."""
    from packer.formats import files, lmdb_env

    mapped_init, handle_init = files.MappedFile.__init__, lmdb_env.Handle.__init__

    def mapped(self: Any, folder: Any, name: str, expected: Any = None, *rest: Any) -> None:
        fd = folder.open(name, expected)
        _willneed(fd)
        os.close(fd)
        mapped_init(self, folder, name, expected, *rest)

    def handle(self: Any, path: str, readahead: bool, expected: Any) -> None:
        handle_init(self, path, readahead, expected)
        fd = os.open(path, os.O_RDONLY)
        _willneed(fd)
        os.close(fd)

    files.MappedFile.__init__ = mapped  # type: ignore[method-assign]
    lmdb_env.Handle.__init__ = handle  # type: ignore[method-assign]


def _patch_thread() -> None:
    """The whole-shard WILLNEED issued by a background thread, so reads overlap the submission."""
    import threading

    from packer.formats import files

    _patch_before()
    mapped_init = files.MappedFile.__init__

    def mapped(self: Any, folder: Any, name: str, expected: Any = None, *rest: Any) -> None:
        fd = folder.open(name, expected)

        def run() -> None:
            try:
                _willneed(fd)
            finally:
                os.close(fd)

        threading.Thread(target=run, daemon=True).start()
        mapped_init(self, folder, name, expected, *rest)

    files.MappedFile.__init__ = mapped  # type: ignore[method-assign]


def _patch_before() -> None:
    """The readers before the shard policy: mapped shards left to the kernel's readahead."""
    from packer.formats import base

    base.shard_readahead = lambda *args: "kernel"  # type: ignore[assignment]


def one_pass(path: Path, variant: str, workers: int, batch_size: int) -> dict[str, Any]:
    """One shuffled epoch in this (forked) process (cold, unless the variant is ``warm``)."""
    if variant == "patched":
        _patch_willneed()
    if variant.startswith("before"):
        _patch_before()
    if variant == "thread":
        _patch_thread()
    files = data_files(path)
    total = sum(f.stat().st_size for f in files)
    if variant in ("folder", "folder-warm"):
        dataset = packer.FolderDataset(path, output="bytes")
    else:
        dataset = packer.open_dataset(path, output="bytes", **_options(path, variant))
    evict_page_cache(files)
    if variant.endswith("warm"):
        prewarm(files)
    before = resident_all(files) or 0.0
    load0 = os.getloadavg()[0]
    try:
        result = measure_throughput(
            dataset, num_workers=workers, batch_size=batch_size, shuffle=True
        )
    finally:
        close_dataset(dataset)
    after = resident_all(files) or 0.0
    return {
        "images_per_s": result.images / result.seconds,
        "seconds": result.seconds,
        "data_bytes": total,
        "disk_over_data": after - before,
        "load": (load0 + os.getloadavg()[0]) / 2,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configs = [(args.src, "folder"), (args.src, "folder-warm")] + [
        (o, v) for o in args.outputs for v in args.variants
    ]
    rows: list[dict[str, Any]] = []
    for w in args.workers:
        for r in range(args.repeats):
            order = configs if r % 2 == 0 else configs[::-1]
            for path, variant in order:
                res = in_child(one_pass, path, variant, w, args.batch_size)
                res.update(name=path.suffix or "folder", variant=variant, workers=w, round=r)
                rows.append(res)
                print(
                    f"w{w} r{r} {res['name']:>7} {variant:>8}: {res['images_per_s']:7,.0f} img/s"
                    f"  disk/data {res['disk_over_data']:.2f}  load {res['load']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    print("| workers | dataset | variant | img/s (median) | × folder | disk bytes ÷ data | load |")
    print("|--:|---|---|--:|--:|--:|--:|")
    for w in args.workers:
        base = statistics.median(
            x["images_per_s"] for x in rows if x["workers"] == w and x["variant"] == "folder"
        )
        for path, variant in configs:
            sel = [
                x
                for x in rows
                if x["workers"] == w
                and x["variant"] == variant
                and x["name"] == (path.suffix or "folder")
            ]
            rate = statistics.median(x["images_per_s"] for x in sel)
            disk = statistics.median(x["disk_over_data"] for x in sel)
            load = statistics.median(x["load"] for x in sel)
            print(
                f"| {w} | {sel[0]['name']} | {variant} | {rate:,.0f} | {rate / base:.2f}× "
                f"| {disk:.2f} | {load:.1f} |"
            )
    if args.out is not None:
        args.out.write_text(json.dumps({"when": time.time(), "passes": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
