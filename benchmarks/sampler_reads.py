#!/usr/bin/env python
"""Shuffled reads of a packed LMDB: packer.ShardedSampler (blocks of consecutive samples) against
torch's RandomSampler (every sample anywhere), through a DataLoader with ``--workers`` workers.

Each pass reads one epoch of raw bytes (``output="bytes"``: the storage, no decode). With
``--caches cold`` the shards' pages are dropped from the page cache before every pass
(``POSIX_FADV_DONTNEED`` after ``sync``, as ``packer bench`` does). The data is made once in
``--data`` (photo-like 400×350 JPEGs, ~87 KB each, 10 classes) and converted with
``--shard-size`` so that there are many shards to shuffle.

Usage::

    python benchmarks/sampler_reads.py --images 4000 --workers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from harness.record import report_head, save_report
from harness.throughput_report import machine_info
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

import packer
from packer.core.manifest import MANIFEST_NAME, load_manifest
from packer.core.sizes import parse_size
from packer.demo.image import make_image_tree
from packer.diagnosis.targets import cold_supported, data_files, evict_page_cache
from packer.diagnosis.timing import time_batches

SAMPLERS = ("random", "sharded", "sharded-256", "sharded-mix8", "sequential")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", type=Path, default=Path("bench-data/sampler"))
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--shard-size", default="16MB")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--caches", nargs="+", choices=("cold", "warm"), default=["cold", "warm"])
    p.add_argument("--samplers", nargs="+", choices=SAMPLERS, default=list(SAMPLERS))
    p.add_argument("--readahead", choices=("on", "off"), default="on")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/sampler_reads.json"))
    return p.parse_args(argv)


def prepare(data: Path, images: int, shard_size: str) -> Path:
    """The packed LMDB of ``images`` generated JPEGs (made once, then reused)."""
    src, dst = data / f"n{images}" / "images", data / f"n{images}" / f"images-{shard_size}.lmdb"
    if not (dst / MANIFEST_NAME).is_file() or load_manifest(dst).num_samples != images:
        if not src.is_dir() or sum(1 for _ in src.rglob("*.JPEG")) != images:
            print(f"generating {images} JPEGs in {src} ...", file=sys.stderr)
            make_image_tree(src, classes=10, per_class=images // 10, bad=0)
        print(f"converting to {dst} ...", file=sys.stderr)
        packer.convert(src, dst, shard_size=parse_size(shard_size), overwrite=True, progress=False)
    return dst


def make_sampler(name: str, dataset: Any, seed: int) -> Any:
    if name == "random":
        return RandomSampler(dataset)
    if name == "sequential":
        return SequentialSampler(dataset)
    block = 256 if name == "sharded-256" else None
    return packer.ShardedSampler(dataset, seed=seed, block=block, mix=8 if "mix" in name else 1)


def keep(batch: list) -> list:
    return batch


def one_pass(root: Path, sampler: str, cache: str, args: argparse.Namespace, seed: int) -> float:
    """Images per second of one epoch."""
    dataset = packer.LMDBDataset(root, output="bytes", readahead=args.readahead == "on")
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        sampler=make_sampler(sampler, dataset, seed),
        num_workers=args.workers,
        collate_fn=keep,
    )
    if cache == "cold":
        evict_page_cache(data_files(root))
    else:
        for _ in DataLoader(dataset, batch_size=256, num_workers=0, collate_fn=keep):
            pass
    timing = time_batches(loader)
    return len(dataset) / timing.seconds


def main(args: argparse.Namespace) -> int:
    """Measure, print a markdown table, write the JSON."""
    if "cold" in args.caches and not cold_supported():
        print("no posix_fadvise here: cold passes are warm", file=sys.stderr)
    root = prepare(args.data, args.images, args.shard_size)
    shards = len(load_manifest(root).shards)
    rows = []
    for cache in args.caches:
        for name in args.samplers:
            rates = [one_pass(root, name, cache, args, seed) for seed in range(args.repeats)]
            rows.append({"sampler": name, "cache": cache, "images_per_s": rates})
            print(f"{cache} {name}: {[round(r) for r in rates]}", file=sys.stderr)
    print(
        f"\n{args.images} images, {shards} shards, workers={args.workers}, batch={args.batch_size}"
    )
    print("\n| sampler | cache | images/s (median) | runs |\n|---|---|---|---|")
    for row in rows:
        runs = ", ".join(f"{r:.0f}" for r in row["images_per_s"])
        median = statistics.median(row["images_per_s"])
        print(f"| {row['sampler']} | {row['cache']} | {median:.0f} | {runs} |")
    report = {**report_head("sampler_reads", machine_info(), args), "shards": shards}
    save_report(args.out, {**report, "results": rows}, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
