#!/usr/bin/env python
"""Samples with fields side by side (issue 30): an image–caption set converted and read by packer,
WebDataset (its own tars) and LitData (its own ``optimize()`` output), in one run.

Data: ``--samples`` photo-like 400×350 JPEGs (quality 90) with captions
(:func:`packer.demo.fields.make_caption_set`, the demo's and the tests' generator), as
key-grouped files, and the same samples as WebDataset tars (``--per-shard`` samples each) and
as LitData chunks (``--chunk-mb``); packer's outputs use shards of the same size.

Conversion (warm, ``--check fast``): ``tar cf`` of the files + ``fsync`` is the baseline; packer
converts the files and the tars to NPY and LMDB. Each conversion is timed ``--repeats`` times,
interleaved with the baseline; the ratio is baseline time / conversion time (≥ 0.5 wanted).

Reading: ``(image bytes, caption)`` through ``DataLoader(num_workers=--workers, batch 64)``,
one epoch each, every page of every image touched by the training process; packer with the
collate its README gives (``packer.collate_fields``; the row ``... list`` with the peers' plain
``list``), the peers' batches as they come; shuffled (packer: ``RandomSampler``; WebDataset:
shard shuffle + a 1,000-sample buffer, the usual recipe; LitData: ``shuffle=True``; packer also
with ``ShardedSampler``, its recipe for cold shuffled reads: shards in random order, samples
shuffled within), **cold** (the reader's files evicted from the page cache first) and **warm** (read once just before), every pass in a fresh process,
readers interleaved, medians of ``--repeats``. Then a cold caption-only pass of packer
(``fields=("txt",)``): the page-cache pages of the dataset after it tell the bytes it read.

Run in the peers' venv (``benchmarks/peers_env.sh``)::

    PYTHONPATH=$PWD /work/benchvenv/bin/python benchmarks/fields_read.py --samples 5000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _files(path: Path) -> list[Path]:
    return [p for p in sorted(path.rglob("*")) if p.is_file()] if path.is_dir() else [path]


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in _files(path))


def prepare(root: Path, samples: int, per_shard: int, chunk_mb: int) -> dict[str, Path]:
    """The key-grouped files, the tars and LitData's chunks (made once, reused)."""
    from packer.demo.fields import make_caption_set, write_shards

    work = root / f"n{samples}"
    marker = work / "made.json"
    expected = {"samples": samples, "per_shard": per_shard, "chunk_mb": chunk_mb, "v": 1}
    paths = {"files": work / "files", "tars": work / "tars", "litdata": work / "litdata"}
    if marker.is_file() and json.loads(marker.read_text()) == expected:
        _log(f"reusing {work}")
        return paths
    _log(f"generating {samples} photo-like 400x350 JPEGs with captions in {paths['files']} ...")
    written = make_caption_set(paths["files"], samples, size=(400, 350), seed=0)
    write_shards(written, paths["tars"], per_shard=per_shard)
    import litdata

    keys = sorted(written)
    litdata.optimize(
        fn=_litdata_item,
        inputs=[str(paths["files"] / k) for k in keys],
        output_dir=str(paths["litdata"]),
        chunk_bytes=f"{chunk_mb}MB",
        num_workers=1,
        reorder_files=False,
        mode="overwrite",
        verbose=False,
    )
    marker.write_text(json.dumps(expected))
    return paths


def _litdata_item(stem: str) -> dict[str, Any]:
    return {"jpg": Path(stem + ".jpg").read_bytes(), "txt": Path(stem + ".txt").read_text()}


def _fsync_tree(path: Path) -> None:
    for file in _files(path):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def time_conversions(paths: dict[str, Path], work: Path, repeats: int, shard: str) -> dict:
    """Seconds of tar cf + fsync and of each packer conversion (warm, --check fast)."""
    import packer

    last = len(_files(paths["tars"])) - 1
    jobs = {
        "tar cf + fsync": None,
        "files -> npy": (paths["files"], "npy"),
        "files -> lmdb": (paths["files"], "lmdb"),
        "tars -> npy": (str(paths["tars"] / f"{{000000..{last:06d}}}.tar"), "npy"),
        "tars -> lmdb": (paths["tars"], "lmdb"),
    }
    for path in _files(paths["files"]) + _files(paths["tars"]):
        path.read_bytes()  # warm
    times: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(repeats):
        for name, job in jobs.items():
            start = time.perf_counter()
            if job is None:
                out = work / "baseline.tar"
                subprocess.run(["tar", "cf", str(out), "-C", str(paths["files"]), "."], check=True)
                _fsync_tree(out)
            else:
                src, fmt = job
                out = work / f"conv.{fmt}"
                packer.convert(
                    src, out, overwrite=True, progress=False, check="fast", shard_size=shard
                )
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(v) for name, v in times.items()}


def one_pass(cfg: dict[str, Any]) -> dict[str, Any]:
    """One epoch of one reader in this (fresh) process."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from packer.diagnosis.io_counters import resident_fraction
    from packer.diagnosis.targets import evict_page_cache

    torch.manual_seed(cfg["seed"])
    source = Path(cfg["path"])
    files = _files(source)
    if cfg["cache"] == "cold":
        evict_page_cache(files)
    else:
        for path in files:
            path.read_bytes()
    keep = list  # the peers' batches kept as they come: no collate cost of theirs counted
    reader = cfg["reader"]
    start = time.perf_counter()
    count = 0
    if reader.startswith("packer"):
        import packer

        dataset = packer.open_dataset(source, fields=tuple(cfg["fields"]), output="bytes")
        loader: Any = DataLoader(
            dataset,
            batch_size=64,
            sampler=(
                packer.ShardedSampler(dataset, seed=cfg["seed"])
                if " sharded" in reader
                else RandomSampler(dataset)
            ),
            num_workers=cfg["workers"],
            collate_fn=keep if reader.endswith(" list") else packer.collate_fields,
            persistent_workers=False,
        )
    elif reader == "webdataset":
        import webdataset as wds

        urls = [str(p) for p in files]
        dataset = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False)
        dataset = dataset.shuffle(1000).to_tuple("jpg", "txt")
        loader = DataLoader(dataset, batch_size=64, num_workers=cfg["workers"], collate_fn=keep)
    else:
        import litdata

        dataset = litdata.StreamingDataset(str(source), shuffle=True, seed=cfg["seed"])
        loader = litdata.StreamingDataLoader(
            dataset, batch_size=64, num_workers=cfg["workers"], collate_fn=keep
        )
    payload = 0
    for batch in loader:
        if reader.startswith("packer") and not reader.endswith(" list"):
            images = batch[0]  # collate_fields: (images, captions)
        else:
            images = [item["jpg"] if isinstance(item, dict) else item[0] for item in batch]
        count += len(images)
        for image in images:  # every page of every image touched, as a decode would
            payload += len(image) + int(np.frombuffer(image, dtype=np.uint8)[::4096].sum() > 0)
    seconds = time.perf_counter() - start
    resident = resident_fraction(files) or 0.0
    return {
        "samples": count, "seconds": seconds, "payload": payload,
        "read_bytes": resident * _bytes(source), "dataset_bytes": _bytes(source),
    }  # fmt: skip


def run_pass(script: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """``script --one-pass CFG`` in a fresh process: the JSON it prints last."""
    out = subprocess.run(
        [sys.executable, script, "--one-pass", json.dumps(cfg)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_pass(cfg: dict[str, Any]) -> dict[str, Any]:
    return run_pass(__file__, cfg)


def data_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the image-caption set and its passes (shared with training_peers.py)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--root", type=Path, default=Path("/work/bench-fields"))
    parser.add_argument("--per-shard", type=int, default=500)
    parser.add_argument("--chunk-mb", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one-pass", help=argparse.SUPPRESS)
    return parser


def answered_one_pass(args: argparse.Namespace, one: Any) -> bool:
    """Run the ``--one-pass`` asked for (print its JSON) and say so; False when none was."""
    if args.one_pass:
        print(json.dumps(one(json.loads(args.one_pass))))
    return bool(args.one_pass)


def packed_set(args: argparse.Namespace) -> dict[str, Path]:
    """:func:`prepare`'s sources plus packer's ``npy`` and ``lmdb`` of the files (made once)."""
    import packer

    paths = prepare(args.root, args.samples, args.per_shard, args.chunk_mb)
    for fmt in ("npy", "lmdb"):
        out = args.root / f"n{args.samples}" / f"packer.{fmt}"
        if not (out / "packer.json").is_file():
            packer.convert(paths["files"], out, shard_size=f"{args.chunk_mb}MB", progress=False)
        paths[fmt] = out
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = data_parser(__doc__ or "")
    parser.add_argument("--skip-convert", action="store_true")
    parser.add_argument("--skip-read", action="store_true")
    args = parser.parse_args(argv)
    if answered_one_pass(args, one_pass):
        return 0
    paths, work, shard = packed_set(args), args.root / f"n{args.samples}", f"{args.chunk_mb}MB"
    targets = {
        "packer.npy": work / "packer.npy", "packer.lmdb": work / "packer.lmdb",
        "packer.npy sharded": work / "packer.npy", "packer.lmdb sharded": work / "packer.lmdb",
        "packer.npy sharded list": work / "packer.npy",
        "webdataset": paths["tars"], "litdata": paths["litdata"],
    }  # fmt: skip
    report: dict[str, Any] = {
        "samples": args.samples,
        "workers": args.workers,
        "load": os.getloadavg(),
    }
    if not args.skip_convert:
        _log("timing conversions ...")
        report["convert_s"] = time_conversions(paths, work, args.repeats, shard)
    runs: dict[str, list[dict[str, Any]]] = {}
    for repeat in range(0 if args.skip_read else args.repeats):
        for cache in ("cold", "warm"):
            for reader, path in targets.items():
                cfg = {
                    "reader": reader, "path": str(path), "cache": cache, "seed": repeat,
                    "workers": args.workers, "fields": ["jpg", "txt"],
                }  # fmt: skip
                got = _run_pass(cfg)
                assert got["samples"] == args.samples, (reader, got)
                runs.setdefault(f"{reader} {cache}", []).append(got)
                _log(f"{reader:12} {cache}: {args.samples / got['seconds']:8.0f} samples/s")
        for fmt in ("npy", "lmdb"):
            cfg = {
                "reader": f"packer.{fmt}", "path": str(targets[f"packer.{fmt}"]), "cache": "cold",
                "seed": repeat, "workers": args.workers, "fields": ["txt"],
            }  # fmt: skip
            runs.setdefault(f"packer.{fmt} captions cold", []).append(_run_pass(cfg))
            _log(f"packer.{fmt} captions cold: {runs[f'packer.{fmt} captions cold'][-1]}")
    report["read"] = {
        name: {
            "samples_per_s": statistics.median(args.samples / r["seconds"] for r in rs),
            "read_fraction": statistics.median(r["read_bytes"] / r["dataset_bytes"] for r in rs),
        }
        for name, rs in runs.items()
    }
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
