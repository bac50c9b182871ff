"""The one conversion pipeline, for every kind and format: plan → load → write → checkpoint → tables.

Shard boundaries are planned from the scanned sizes before any byte is read, samples are loaded
in parallel and written in source order, each planned shard is made durable and checkpointed
(``packer.write.resume``) as it completes, and the sample and record tables, keys and (last) the
manifest are written from the checkpoints. The output is byte-for-byte the same whatever
``workers``, and an interrupted run resumes from its last complete shard.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import sys
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from packer.core.manifest import (
    INDEX_NAME,
    KEYS_NAME,
    LAYOUT_VERSION,
    MANIFEST_NAME,
    RECORDS_NAME,
    SAMPLE_DTYPE,
    Manifest,
    shard_name,
    write_index,
    write_keys,
    write_manifest,
    write_records,
)
from packer.errors import InputFileError, PackerError
from packer.source.images import SkippedInput
from packer.write.loading import Loaded, load_in_order
from packer.write.overlap import ShardFinisher, keep_heap_for_writes
from packer.write.resume import PROGRESS_DIR, Checkpoint, Progress, Rows, skipped_dicts

__all__ = [
    "Job",
    "Prepared",
    "end_shard",
    "finalize",
    "plan_shards",
    "store_sample",
    "write_shards",
]

Event = Callable[[str, int], None]
# Called as ``after_shard(job, shard, checkpoint)`` once planned shard ``shard`` of the output
# ``job`` builds in ``job.partial`` is durable and checkpointed (its files are final).
ShardHook = Callable[["Job", int, Checkpoint], None]
# A pool task loads consecutive inputs of this many source bytes (a dozen photos, one video):
# what a task costs the pool (~0.1 ms in a process pool) is spread over them.
_LOAD_BATCH_BYTES = 1 << 20


def plan_shards(sizes: Sequence[int], shard_size: int) -> tuple[np.ndarray, list[int]]:
    """Assign consecutive samples to shards of at most ``shard_size`` bytes (one big sample may
    exceed it alone). Returns the shard of every sample and the planned bytes of every shard."""
    shard_of = np.zeros(len(sizes), dtype=np.int32)
    planned: list[int] = []
    current = 0
    for i, size in enumerate(sizes):
        if not planned or (current > 0 and current + size > shard_size):
            planned.append(0)
            current = 0
        current += size
        planned[-1] += size
        shard_of[i] = len(planned) - 1
    return shard_of, planned


@dataclass(frozen=True)
class Prepared:
    """A kind's part of a conversion: the scanned source, how to load one sample (a picklable
    callable), whether loading is CPU-bound, the kind's options for the manifest, the unit.
    Two are equal when their sources and options are: the loader is made from the options."""

    source: Any
    loader: Callable[[Any], Loaded] = field(compare=False)
    cpu_bound: bool
    options: dict[str, Any]
    unit: str


@dataclass(frozen=True, kw_only=True)
class Job:
    """What the pipeline needs of one conversion (:meth:`packer.write.plan.ConversionPlan.job`).

    ``source`` has ``root``, ``kind``, ``classes``, ``samples`` (each with ``key``, ``label``,
    ``size``), ``skipped`` and ``total_bytes``; ``loader(sample)`` turns a sample into its
    records (run in a process pool when ``cpu_bound``). ``on_event(name, number)`` is called
    with ``("sample", i)`` after sample ``i`` is written, ``("shard", k)`` after planned shard
    ``k`` is durable, ``("tables", 0)`` before and ``("manifest", 0)`` after the manifest (a
    ``part``: ``("tables", 0)`` before its ``part.json``).
    ``after_shard`` (a :data:`ShardHook`) is called just before that ``("shard", k)`` event.
    """

    fmt: ModuleType
    layout: str
    partial: Path
    source: Any
    loader: Callable[[Any], Loaded]
    cpu_bound: bool
    shard_size: int
    workers: int
    strict: bool
    progress: bool
    unit: str = "img"
    on_event: Event | None = None
    after_shard: ShardHook | None = None
    max_file_size: int | None = None  # inputs above it are skipped: they plan as 0 bytes

    @functools.cached_property
    def name_max(self) -> int:
        """The longest file name the output file system takes (asked once)."""
        return os.pathconf(self.partial, "PC_NAME_MAX") if hasattr(os, "pathconf") else 255

    def emit(self, name: str, number: int) -> None:
        if self.on_event is not None:
            self.on_event(name, number)


def _skip(job: Job, current: Rows, path: str, reason: str) -> None:
    if job.strict:
        raise InputFileError(f"{path}: {reason} (--strict)")
    current.skipped.append({"path": path, "reason": reason})


class LineProgress:
    """Progress for a log file or a pipe (stderr is not a terminal): a plain line every
    ``every`` seconds and one at the end, never a carriage return."""

    def __init__(self, total: int, initial: int, desc: str, unit: str, every: float = 5.0) -> None:
        self.total, self.n, self.desc, self.unit, self.every = total, initial, desc, unit, every
        self.postfix = ""
        self._last = time.perf_counter()

    def update(self, n: int = 1) -> None:
        self.n += n
        if (now := time.perf_counter()) - self._last >= self.every:
            self._last = now
            self._line()

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def _line(self) -> None:
        extra = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}{extra}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self._line()


def _bar(job: Job, total: int, initial: int) -> Any:
    desc = f"convert → {job.fmt.NAME}"
    if job.progress and not sys.stderr.isatty():
        return LineProgress(total, initial, desc, job.unit)
    return tqdm(total=total, initial=initial, unit=job.unit, desc=desc, disable=not job.progress)


def _loaded(job: Job, todo: list[Any]) -> Generator[Loaded, None, None]:
    return load_in_order(job.loader, todo, job.workers, job.cpu_bound, _LOAD_BATCH_BYTES)


def store_sample(
    job: Job, writer: Any, current: Rows, sample: Any, loaded: Loaded, shard: int
) -> None:
    """Write one loaded sample into the open shard and note its rows, or note why it is not."""
    for path, reason in loaded.dropped:
        _skip(job, current, path, f"frame dropped: {reason}")
    per_sample = job.layout == "per-sample"
    if loaded.records is not None and per_sample and not _name_fits(sample.key, job.name_max):
        loaded = Loaded(None, "name too long for the output file system")
    if loaded.records is None:
        _skip(job, current, sample.path, loaded.reason or "unknown problem")
        return
    try:
        offsets = writer.write(shard, sample.key, loaded.records)
    except InputFileError as exc:  # the writer refused this input (it grew since the scan)
        _skip(job, current, sample.path, str(exc))
        return
    lengths = [len(r) for r in loaded.records]
    current.add(sample.label, sample.key, lengths, offsets, loaded.checksums)


def end_shard(
    job: Job,
    writer: Any,
    progress: Progress,
    done: list[Checkpoint],
    current: Rows,
    shard: int,
) -> Rows:
    """Make planned shard ``shard`` durable, checkpoint it, and start the next one."""
    info = writer.finish_shard()
    final = getattr(writer, "final_offsets", None)  # offsets known only once the shard is done
    file = -1 if job.layout == "per-sample" else shard
    try:
        checkpoint = current.checkpoint(info, file, final if info is not None else None)
    except PackerError as exc:
        raise PackerError(f"shard {shard}: {exc}") from None
    progress.save(shard, checkpoint)
    done.append(checkpoint)
    if job.after_shard is not None:
        job.after_shard(job, shard, checkpoint)
    job.emit("shard", shard)
    return Rows()


def _name_fits(key: str, limit: int) -> bool:
    """Whether the per-sample file named after ``key`` plus its suffix (``.npy``, ``.h5``,
    ``.bmp``: at most 4 bytes) fits a file name of at most ``limit`` bytes."""
    return max(len(os.fsencode(part)) for part in key.split("/")) + 4 <= limit


def write_shards(job: Job, done: list[Checkpoint], progress: Progress) -> list[Checkpoint]:
    """Write every planned shard after the ``done`` ones, checkpointing each as it completes.

    Each shard has its own writer; once its last sample is written, the shard is finished
    (made durable, checkpointed) by a :class:`packer.write.overlap.ShardFinisher` while the next one
    is written (in the background with ``workers > 1``)."""
    samples = job.source.samples
    cap = job.max_file_size
    sizes = [0 if cap is not None and s.size > cap else s.size for s in samples]
    shard_of, planned = plan_shards(sizes, job.shard_size)
    ends = [*(np.flatnonzero(np.diff(shard_of)) + 1).tolist(), len(samples)] if len(samples) else []
    first = ends[len(done) - 1] if done else 0
    for k in range(len(done), len(planned)):  # a half-written shard is rewritten from scratch
        (job.partial / shard_name(k, job.fmt.SHARD_SUFFIX)).unlink(missing_ok=True)
    keep_heap_for_writes()
    todo = samples[first:]
    bar = _Bar(job, len(samples), first)
    # closing(): a failure (disk full, ...) shuts the loading pool down here and now; left to
    # the garbage collector, its shutdown ran inside a later thread's start and deadlocked it.
    with (
        contextlib.closing(_loaded(job, todo)) as results,
        ShardFinisher(background=job.workers > 1) as finisher,
    ):
        loaded = zip(range(first, len(samples)), todo, results)
        for shard in range(len(done), len(planned)):
            writer = job.fmt.Writer(job.partial, planned, job.layout, job.source.kind)
            with _until_handed(writer):
                rows = Rows()
                start = ends[shard - 1] if shard else 0
                for i, sample, result in itertools.islice(loaded, ends[shard] - start):
                    store_sample(job, writer, rows, sample, result, shard)
                    job.emit("sample", i)
                    bar.update(sample.size)
            finisher.submit(functools.partial(_finish, job, writer, progress, done, rows, shard))
    bar.close()
    return done


class _until_handed:  # noqa: N801 - used as a statement: ``with _until_handed(writer):``
    """Discard the writer's open shard if its samples fail to be written (leave it open, to be
    finished, otherwise)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.writer.__exit__(kind, exc, tb)


def _finish(
    job: Job, writer: Any, progress: Progress, done: list[Checkpoint], rows: Rows, shard: int
) -> None:
    """Make shard ``shard`` durable and checkpoint it (or, on failure, discard it)."""
    with writer:
        end_shard(job, writer, progress, done, rows, shard)


class _Bar:
    """The progress bar of :func:`write_shards`: samples done (``n``) and the source MB/s."""

    def __init__(self, job: Job, total: int, initial: int) -> None:
        self.bar, self.n, self.show = _bar(job, total, initial), initial, job.progress
        self.begun, self.last, self.bytes = time.perf_counter(), 0.0, 0

    def update(self, size: int) -> None:
        self.n += 1
        self.bytes += size
        self.bar.update(1)
        if self.show and (now := time.perf_counter()) - self.last > 0.5:
            self.bar.set_postfix_str(f"{self.bytes / (now - self.begun) / 1e6:.1f} MB/s")
            self.last = now

    def close(self) -> None:
        self.bar.close()


def _tables(job: Job, done: list[Checkpoint]) -> tuple[np.ndarray, np.ndarray]:
    """The sample and record tables from all checkpoints, with files numbered as listed."""
    samples = np.concatenate([Checkpoint().samples, *(c.samples for c in done)])
    index = np.zeros(len(samples), dtype=SAMPLE_DTYPE)
    index["label"], index["count"] = samples["label"], samples["count"]
    index["first"][1:] = np.cumsum(samples["count"], dtype=np.int64)[:-1]
    records = np.concatenate([Checkpoint().records, *(c.records for c in done)])
    if job.layout == "per-sample":
        records["file"] = np.repeat(np.arange(len(index)), index["count"])
    elif len(records):
        listed = [c.shard for c in done if c.shard is not None]
        position = np.full(len(done) + 1, -1, dtype=np.int64)
        for n, shard in enumerate(listed):
            position[int(shard.name[6:11])] = n  # planned shard number -> listed position
        records["file"] = position[records["file"]]
    return index, records


def _storage(job: Job, index: np.ndarray, records: np.ndarray, shard_bytes: int) -> dict:
    """Bytes on disk against bytes of records (NPY pads video frames to the largest)."""
    skip = {MANIFEST_NAME, INDEX_NAME, RECORDS_NAME, KEYS_NAME}
    data_bytes = shard_bytes or sum(
        f.stat().st_size
        for f in job.partial.rglob("*")
        if f.is_file() and f.name not in skip and PROGRESS_DIR not in f.parts
    )
    record_bytes = int(records["length"].sum())
    storage = {
        "records": len(records),
        "record_bytes": record_bytes,
        "data_bytes": int(data_bytes),
        "padding_overhead": round(data_bytes / record_bytes, 4) if record_bytes else 1.0,
    }
    if job.source.kind == "video":
        counts = index["count"]
        storage |= {
            "frames": len(records),
            "frame_bytes": record_bytes,
            "max_frames": int(counts.max()),
            "mean_frames": round(float(counts.mean()), 2),
        }
    return storage


# The temp names manifest.py writes the tables and manifest through (then renames).
_TEMP_NAMES = ("index.tmp.npy", "records.tmp.npy", f"{KEYS_NAME}.tmp", f"{MANIFEST_NAME}.tmp")


def finalize(
    job: Job, done: list[Checkpoint], options: dict[str, Any]
) -> tuple[Manifest, list[SkippedInput]]:
    """Write the tables, keys and (last) the manifest from all checkpoints."""
    source = job.source
    index, records = _tables(job, done)
    if not len(index):
        raise PackerError(
            f"no usable {job.unit} in {source.root!r}: all {len(source.samples)} inputs were "
            "skipped (see the reasons with --strict)"
        )
    skipped = skipped_dicts(source.skipped) + [s for c in done for s in c.skipped]
    for stale in _TEMP_NAMES:  # a run killed while writing its tables left one
        (job.partial / stale).unlink(missing_ok=True)
    files = {
        INDEX_NAME: write_index(job.partial, index),
        RECORDS_NAME: write_records(job.partial, records),
        KEYS_NAME: write_keys(job.partial, (k for c in done for k in c.keys)),
    }
    shards = [c.shard for c in done if c.shard is not None]
    options = dict(options, storage=_storage(job, index, records, sum(s.bytes for s in shards)))
    manifest = Manifest(
        format=job.fmt.NAME,
        kind=source.kind,
        num_samples=len(index),
        classes=source.classes,
        shards=shards,
        skipped=skipped,
        source=dict(source.describe()),
        options=options,
        files=files,
        layout_version=LAYOUT_VERSION,
    )
    job.emit("tables", 0)
    write_manifest(job.partial, manifest)
    job.emit("manifest", 0)
    return manifest, [SkippedInput(s["path"], s["reason"]) for s in skipped]
