"""What ``benchmarks/state_dict_cost.py`` measures: the cost of a torchdata ``StatefulDataLoader``
checkpoint over a packed dataset or a :class:`packer.Mixture`, read with
:class:`packer.ShardedSampler`.

One *pass* builds a loader, reads ``batches`` batches (timing each ``next()``: the batch
interval), calls ``loader.state_dict()`` after each one (timed apart) and records the pickled
size of the state. Its ``snapshot_every`` is torchdata's ``snapshot_every_n_steps``: 1 (the
default) makes the loader snapshot the main process's state (the sampler's ``state_dict()``)
and the workers' state at every batch, whether or not anyone calls ``state_dict()``; ``None``
never does (``state_dict()`` is then not usable mid-epoch with workers, so the pair measures
what the per-step snapshots cost inside the batch interval, and in CPU time: this process's and
its reaped workers', start-up included, per timed batch, which other processes' load changes far
less than the interval). Also measured on the sampler alone:
its ``state_dict()`` and a resume (``load_state_dict`` then the first index, which builds the
epoch's order).
"""

from __future__ import annotations

import gc
import pickle
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import packer
from harness.host_load import own_usage
from packer.core.manifest import MANIFEST_NAME, load_manifest
from packer.demo.image import make_image_tree

__all__ = ["Config", "one_pass", "open_target", "prepare_small", "sampler_costs"]


@dataclass(frozen=True)
class Config:
    """One measured setting."""

    size: str  # "small" or "1M"
    target: str  # "packed" or "mixture"
    workers: int
    snapshot_every: int | None


def prepare_small(data: Path, images: int) -> dict[str, Path]:
    """An LMDB and an NPY output of ``images`` demo JPEGs each (different seeds), made once."""
    out = {}
    for fmt, seed in (("lmdb", 1), ("npy", 2)):
        dst = data / f"small{images}-{seed}.{fmt}"
        if not (dst / MANIFEST_NAME).is_file() or load_manifest(dst).num_samples != images:
            tree = make_image_tree(
                data / f"tree{images}-{seed}", classes=10, per_class=images // 10,
                size=(96, 72), bad=0, seed=seed,
            )  # fmt: skip
            packer.convert(tree.root, dst, shard_size="256kB", overwrite=True, progress=False)
        out[fmt] = dst
    return out


def open_target(target: str, main: Path, extra: Path) -> Any:
    """The packed dataset ``main`` (bytes), or a Mixture of it with ``extra`` at 3:1."""
    first = packer.open_dataset(main, output="bytes")
    if target == "packed":
        return first
    second = packer.open_dataset(extra, output="bytes")
    return packer.Mixture({"main": first, "extra": second}, weights={"main": 3, "extra": 1})


def _keep(batch: list[Any]) -> list[Any]:
    return batch


def one_pass(dataset: Any, config: Config, batches: int, batch_size: int) -> dict[str, Any]:
    """Read ``batches`` batches (after one untimed batch that starts the workers; each epoch's
    first batch is untimed too: small datasets are read for several epochs); the mean
    batch interval, the median and max ``state_dict()`` time, and the state's pickled bytes."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    sampler = packer.ShardedSampler(dataset, seed=0)
    loader = StatefulDataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=config.workers,
        collate_fn=_keep,
        snapshot_every_n_steps=config.snapshot_every,
        multiprocessing_context="fork" if config.workers else None,
    )
    gc.collect()
    cpu_before = own_usage()[0]
    it = iter(loader)
    for _ in range(1 + 4 * config.workers):  # every worker started and past its first batch
        it = _advance(loader, it)[0]
    intervals, calls, size = [], [], 0
    while len(intervals) < batches:
        begun = time.perf_counter()
        it, restarted = _advance(loader, it)
        if restarted:  # a small dataset's epoch ended: the next epoch's start is untimed
            continue
        middle = time.perf_counter()
        if config.snapshot_every is not None:
            state = loader.state_dict()
            calls.append(time.perf_counter() - middle)
            size = len(pickle.dumps(state))
        intervals.append(middle - begun)
    del it, loader  # the workers exit and are reaped: their CPU time is counted
    gc.collect()
    cpu = own_usage()[0] - cpu_before
    return {
        "cpu_s_per_batch": cpu / batches,
        "batch_s": sum(intervals) / len(intervals),  # the mean: workers prefetch, so single
        # intervals swing between a queued batch (µs) and a wait for one
        "state_dict_s": statistics.median(calls) if calls else None,
        "state_dict_max_s": max(calls) if calls else None,
        "state_bytes": size or None,
    }


def _advance(loader: Any, it: Any) -> tuple[Any, bool]:
    """Take one batch; at the end of the epoch start the next one (and say so)."""
    try:
        next(it)
        return it, False
    except StopIteration:
        it = iter(loader)
        next(it)
        return it, True


def sampler_costs(dataset: Any, repeats: int = 200) -> dict[str, Any]:
    """The sampler alone, mid-epoch: ``state_dict()`` (median of ``repeats``), its pickled size,
    and a resume: ``load_state_dict`` into a new sampler plus its first index."""
    sampler = packer.ShardedSampler(dataset, seed=0)
    it = iter(sampler)
    for _ in range(min(1000, len(sampler) // 2)):
        next(it)
    times = []
    for _ in range(repeats):
        begun = time.perf_counter()
        state = sampler.state_dict()
        times.append(time.perf_counter() - begun)
    resumed = packer.ShardedSampler(dataset, seed=0)
    begun = time.perf_counter()
    resumed.load_state_dict(state)
    next(iter(resumed))
    return {
        "sampler_state_dict_s": statistics.median(times),
        "sampler_state_bytes": len(pickle.dumps(state)),
        "resume_first_index_s": time.perf_counter() - begun,
        "blocks": len(sampler.starts),
    }
