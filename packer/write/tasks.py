"""One task per planned shard, on any executor, and ``--part I/N`` slices that ``packer merge`` joins.

A conversion's planned shards are independent: a shard's file (or its per-sample files, named by
their keys) and its checkpoint depend only on its own inputs. So :func:`write_shard` — the local
pipeline for one shard: load its inputs, write them, make the shard durable, save its checkpoint
in ``DST.partial/_progress/`` — can run anywhere that sees ``DST.partial/`` (a shared file system),
and the client gathers the checkpoints and writes the tables and manifest with
:func:`packer.write.pipeline.finalize`, exactly as a local conversion does: the same bytes.

The executor is anything with ``submit(fn, *args)`` returning a future with
``add_done_callback`` and ``result()``: a ``concurrent.futures`` pool, ``distributed.Client``
(given ``retries`` and ``pure=False``) or its ``get_executor()``, a Ray adapter. Each attempt at a
shard writes into its own folder (``_progress/attempts/``) and moves its files into place only
once they are durable, so a retried, duplicated or orphaned attempt never mixes its bytes into
another's; a checkpointed shard is never redone, so ``--resume`` keeps every complete shard.

Without a client (SLURM arrays), ``part=(i, n)`` converts the planned shards ``k`` with
``k % n == i`` into ``DST.part-i/`` (shard files, their checkpoints and ``part.json``, written
last); :mod:`packer.merge` joins the ``n`` parts into ``DST``.
"""

from __future__ import annotations

import functools
import json
import os
import queue
import shutil
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from packer.core.manifest import Manifest, _write_atomic, fsync_dir
from packer.errors import PackerError
from packer.formats import by_name
from packer.write.loading import Loaded, load_in_order
from packer.write.overlap import keep_heap_for_writes
from packer.write.pipeline import (
    Event,
    Job,
    LineProgress,
    end_shard,
    finalize,
    plan_shards,
    store_sample,
)
from packer.write.resume import PROGRESS_DIR, Checkpoint, Progress, Rows, skipped_dicts

__all__ = [
    "PART_MANIFEST",
    "RETRIES",
    "ShardTask",
    "parse_part",
    "part_path",
    "run_distributed",
    "write_shard",
]

RETRIES = 2  # Dask re-runs a task that raised this many times (a lost worker is rescheduled anyway)
PART_MANIFEST = "part.json"
ATTEMPTS = "attempts"  # DST.partial/_progress/attempts/<shard>-<id>/: a task's files until done
PART_VERSION = 1


@dataclass(frozen=True, kw_only=True)
class ShardTask:
    """Everything one planned shard needs, picklable: the format by name, the shard's samples."""

    fmt_name: str
    layout: str
    kind: str
    partial: Path
    planned: list[int]
    shard: int
    first: int  # the number of the shard's first sample in the source
    samples: list[Any]
    loader: Callable[[Any], Loaded]
    cpu_bound: bool
    workers: int
    strict: bool
    unit: str
    on_event: Event | None = None


def write_shard(task: ShardTask) -> Checkpoint:
    """Write planned shard ``task.shard`` from scratch into ``task.partial``, make it durable and
    checkpoint it; return the checkpoint. Runs on a worker (or in the converting process)."""
    fmt = by_name(task.fmt_name)
    keep_heap_for_writes()  # as a local conversion does: commits reuse the freed heap
    attempt = task.partial / PROGRESS_DIR / ATTEMPTS / f"{task.shard:05d}-{uuid.uuid4().hex}"
    attempt.mkdir(parents=True)
    job = Job(
        fmt=fmt,
        layout=task.layout,
        partial=attempt,
        source=None,
        loader=task.loader,
        cpu_bound=task.cpu_bound,
        shard_size=0,
        workers=task.workers,
        strict=task.strict,
        progress=False,
        unit=task.unit,
        on_event=task.on_event,
    )
    done: list[Checkpoint] = []
    current = Rows()
    loaded = load_in_order(task.loader, task.samples, task.workers, task.cpu_bound)
    with closing(loaded), fmt.Writer(attempt, task.planned, task.layout, task.kind) as writer:
        for i, (sample, result) in enumerate(zip(task.samples, loaded), start=task.first):
            store_sample(job, writer, current, sample, result, task.shard)
            job.emit("sample", i)
        end_shard(job, writer, _Publish(attempt, task.partial), done, current, task.shard)
    return done[0]


class _Publish(Progress):
    """The progress of one attempt at a shard: once the shard is durable, move its files into
    the output, then checkpoint it there. An attempt writes only in its own folder, so a retried
    or orphaned attempt of the same shard can never mix its bytes into another's."""

    def __init__(self, attempt: Path, partial: Path) -> None:
        super().__init__(partial)
        self.attempt, self.partial = attempt, partial

    def save(self, number: int, checkpoint: Checkpoint) -> None:
        touched = set()
        for root, _, files in os.walk(self.attempt):
            target = self.partial / Path(root).relative_to(self.attempt)
            target.mkdir(parents=True, exist_ok=True)
            for name in files:
                os.replace(Path(root) / name, target / name)
                touched.add(target)
        for folder in touched:
            fsync_dir(folder)
        shutil.rmtree(self.attempt, ignore_errors=True)
        super().save(number, checkpoint)


def parse_part(text: str) -> tuple[int, int]:
    """``"I/N"`` → ``(I, N)`` with ``0 <= I < N``."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise PackerError(f"invalid part {text!r}; expected I/N such as 0/4") from None
    check_part((i, n))
    return i, n


def check_part(part: tuple[int, int]) -> None:
    """Refuse a part that is not a pair ``(I, N)`` of ints with ``0 <= I < N``."""
    pair = tuple(part) if isinstance(part, (tuple, list)) else ()
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
        raise PackerError(f"part must be a pair (I, N) of ints, such as (0, 4); got {part!r}")
    i, n = pair
    if not 0 <= i < n:
        raise PackerError(f"invalid part {i}/{n}; expected I/N with 0 <= I < N, such as 0/4")


def part_path(dst: Path, i: int) -> Path:
    """The folder of part ``i`` of ``dst``: ``DST.part-I``."""
    return dst.with_name(f"{dst.name}.part-{i}")


def shard_bounds(job: Job) -> tuple[list[int], list[int]]:
    """The planned bytes of every shard and where each shard's samples start (plus the end),
    planned exactly as :func:`packer.write.pipeline.write_shards` plans them."""
    cap = job.max_file_size
    sizes = [0 if cap is not None and s.size > cap else s.size for s in job.source.samples]
    shard_of, planned = plan_shards(sizes, job.shard_size)
    bounds = np.searchsorted(shard_of, np.arange(len(planned) + 1), side="left")
    return planned, [int(b) for b in bounds]


def _submitter(executor: Any) -> Callable[..., Any]:
    """``executor.submit``, with retries (and no result caching) for a ``distributed.Client``."""
    if not callable(getattr(executor, "submit", None)):
        raise PackerError(f"executor {executor!r} has no submit(fn, *args) method")
    if type(executor).__module__.startswith("distributed") and hasattr(executor, "gather"):
        return functools.partial(executor.submit, retries=RETRIES, pure=False)
    return executor.submit


def _results(
    executor: Any, tasks: list[ShardTask], window: int | None = None
) -> Iterator[tuple[int, Checkpoint]]:
    """Each task's (shard, checkpoint) as it completes; in order, in this process, without an
    executor. With ``window``, at most that many tasks are submitted and not yet consumed (a
    consumer that waits, such as an upload, holds the writing back). The first failure cancels
    the tasks not yet done and is raised."""
    if executor is None:
        for task in tasks:
            yield task.shard, write_shard(task)
        return
    submit = _submitter(executor)
    finished: queue.Queue[tuple[int, Any]] = queue.Queue()
    futures: list[Any] = []
    todo = iter(tasks)

    def submit_next() -> None:
        task = next(todo, None)
        if task is not None:
            future = submit(write_shard, task)
            future.add_done_callback(
                functools.partial(lambda k, f: finished.put((k, f)), task.shard)
            )
            futures.append(future)

    try:
        for _ in range(len(tasks) if window is None else window):
            submit_next()
        for _ in tasks:
            shard, future = finished.get()
            yield shard, future.result()
            submit_next()
    except BaseException:
        for future in futures:
            future.cancel()
        raise


def executor_slots(executor: Any) -> int:
    """How many tasks ``executor`` runs at once: a ``distributed.Client``'s threads, a pool's
    workers; 8 when it does not say."""
    try:
        if hasattr(executor, "nthreads") and callable(executor.nthreads):
            return max(1, sum(executor.nthreads().values()))
        return max(1, int(executor._max_workers))
    except Exception:
        return 8


def _bar(job: Job, total: int, initial: int, where: str) -> Any:
    desc = f"convert → {job.fmt.NAME} ({where})"
    if job.progress and not sys.stderr.isatty():
        return LineProgress(total, initial, desc, job.unit)
    return tqdm(total=total, initial=initial, unit=job.unit, desc=desc, disable=not job.progress)


def _intact(partial: Path, checkpoint: Checkpoint) -> bool:
    """Whether a checkpointed shard's file is still there with its recorded size."""
    if checkpoint.shard is None:
        return True
    try:
        return (partial / checkpoint.shard.name).stat().st_size == checkpoint.shard.bytes
    except OSError:
        return False


def run_shards(
    job: Job,
    done: list[Checkpoint],
    progress: Progress,
    executor: Any = None,
    part: tuple[int, int] | None = None,
) -> tuple[dict[int, Checkpoint], int]:
    """Write every wanted planned shard without a checkpoint, one task each; return the wanted
    shards' checkpoints by number and the number of planned shards. ``done`` are the
    checkpoints :meth:`Progress.resume` found (the others present are loaded here)."""
    planned, bounds = shard_bounds(job)
    wanted = [k for k in range(len(planned)) if part is None or k % part[1] == part[0]]
    have = {k: c for k, c in enumerate(done) if part is None or k % part[1] == part[0]}
    for k in wanted:
        if k not in have and (checkpoint := progress.load(k)) is not None:
            if _intact(job.partial, checkpoint):  # a local run may have deleted it since
                have[k] = checkpoint
    samples = job.source.samples
    tasks = [
        ShardTask(
            fmt_name=job.fmt.NAME,
            layout=job.layout,
            kind=job.source.kind,
            partial=job.partial,
            planned=planned,
            shard=k,
            first=bounds[k],
            samples=samples[bounds[k] : bounds[k + 1]],
            loader=job.loader,
            cpu_bound=job.cpu_bound,
            workers=job.workers if executor is None else 1,
            strict=job.strict,
            unit=job.unit,
            on_event=job.on_event,
        )
        for k in wanted
        if k not in have
    ]
    count = sum(bounds[k + 1] - bounds[k] for k in wanted)
    initial = sum(bounds[k + 1] - bounds[k] for k in have)
    where = "local" if executor is None else type(executor).__name__
    bar = _bar(job, count, initial, where if part is None else f"part {part[0]}/{part[1]}")
    hook = job.after_shard  # an upload (packer.upload.stream): shards are sent as they come
    window = 2 * executor_slots(executor) if hook and executor is not None else None
    try:
        for shard, checkpoint in _results(executor, tasks, window):
            have[shard] = checkpoint
            if hook is not None:
                hook(job, shard, checkpoint)
            bar.update(bounds[shard + 1] - bounds[shard])
            bar.set_postfix_str(f"shards {len(have)}/{len(wanted)}")
    finally:
        bar.close()
    return have, len(planned)


def run_distributed(
    job: Job,
    done: list[Checkpoint],
    progress: Progress,
    options: dict[str, Any],
    fp: dict[str, Any],
    executor: Any = None,
    part: tuple[int, int] | None = None,
) -> Manifest:
    """Write the shards (all, or a part's) with ``executor``; then the tables and manifest, or
    for a part its ``part.json``. Returns the manifest (for a part: what the part holds)."""
    have, planned = run_shards(job, done, progress, executor, part)
    shutil.rmtree(progress.dir / ATTEMPTS, ignore_errors=True)  # left by lost workers
    if part is None:
        manifest, _ = finalize(job, [have[k] for k in range(planned)], options)
        return manifest
    return write_part(job, have, planned, options, fp, part)


def write_part(
    job: Job,
    have: dict[int, Checkpoint],
    planned: int,
    options: dict[str, Any],
    fp: dict[str, Any],
    part: tuple[int, int],
) -> Manifest:
    """Write ``part.json`` (last): what :mod:`packer.merge` needs besides the checkpoints."""
    source = job.source
    shards = sorted(have)
    record = {
        "packer_part": PART_VERSION,
        "part": list(part),
        "planned_shards": planned,
        "shards": shards,
        "format": job.fmt.NAME,
        "layout": job.layout,
        "kind": source.kind,
        "unit": job.unit,
        "classes": list(source.classes),
        "source": dict(source.describe()),
        "scan_skipped": skipped_dicts(source.skipped),
        "options": options,
        "fingerprint": fp,
    }
    payload = json.dumps(record, indent=1).encode("ascii")
    job.emit("tables", 0)  # as before a manifest: the part's shards are all written
    _write_atomic(job.partial / PART_MANIFEST, payload)
    fsync_dir(job.partial)
    checkpoints = [have[k] for k in shards]
    return Manifest(
        format=job.fmt.NAME,
        kind=source.kind,
        num_samples=sum(len(c.samples) for c in checkpoints),
        classes=list(source.classes),
        shards=[c.shard for c in checkpoints if c.shard is not None],
        skipped=[s for c in checkpoints for s in c.skipped],
        source=dict(source.describe()),
        options=dict(options, part=list(part), planned_shards=planned),
    )
