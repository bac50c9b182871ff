"""Convert a source folder into a packed dataset: scan → parallel read/check → writer → manifest.

The output is built in ``DST.partial/`` and renamed to ``DST`` only once complete; the manifest
is written last, so its presence means the dataset is whole. Shard boundaries are planned from
the scanned file sizes before any byte is read, and samples are written in scan order, so the
output is byte-for-byte the same whatever the number of workers.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from packer.check import CHECKS
from packer.errors import DestinationError, InputFileError, PackerError
from packer.formats import by_name, format_for
from packer.manifest import (
    INDEX_DTYPE,
    INDEX_NAME,
    KEYS_NAME,
    Manifest,
    shard_name,
    write_index,
    write_keys,
    write_manifest,
)
from packer.pipeline import default_workers, load_in_order
from packer.resume import Checkpoint, Progress, fault_point, fingerprint, skipped_dicts
from packer.sizes import format_size, parse_size
from packer.sources import Scan, SkippedInput, scan
from packer.video.sources import detect_kind

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "ConvertResult",
    "check_destination",
    "convert",
    "plan_shards",
    "publish",
]

DEFAULT_SHARD_SIZE = 1 << 30


@dataclass
class ConvertResult:
    """What a conversion did: the manifest written and the numbers for the summary."""

    dst: Path
    manifest: Manifest
    seconds: float
    bytes_in: int
    bytes_out: int
    skipped: list[SkippedInput] = field(default_factory=list)

    def summary(self) -> str:
        """A few human-readable lines: counts, sizes, time, skipped inputs."""
        m = self.manifest
        rate = self.bytes_in / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"wrote {self.dst} ({m.format}): {m.num_samples} samples, {len(m.classes)} classes, "
            f"{len(m.shards) or m.num_samples} file(s)",
            f"read {format_size(self.bytes_in)}, wrote {format_size(self.bytes_out)} "
            f"in {self.seconds:.1f} s ({format_size(rate)}/s)",
        ]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} input(s) (listed in the manifest):")
            lines += [f"  {s.path}: {s.reason}" for s in self.skipped[:10]]
            if len(self.skipped) > 10:
                lines.append(f"  ... and {len(self.skipped) - 10} more (packer inspect --skipped)")
        return "\n".join(lines)


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


def check_destination(dst: Path, overwrite: bool) -> None:
    if dst.exists() and not overwrite:
        raise DestinationError(f"destination {str(dst)!r} exists; pass --overwrite to replace it")
    parent = dst.parent if str(dst.parent) else Path(".")
    if not parent.is_dir():
        raise DestinationError(f"cannot create {str(dst)!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DestinationError(
            f"cannot create {str(dst)!r}: folder {str(parent)!r} is not writable"
        )


def _validate(fmt_name: str | None, dst: Path, workers: int | None, check: str) -> ModuleType:
    fmt = by_name(fmt_name) if fmt_name else format_for(dst)
    if workers is not None and workers < 1:
        raise PackerError(f"invalid workers {workers}; expected 1 or more")
    if check not in CHECKS:
        raise PackerError(f"invalid check {check!r}; expected one of {', '.join(CHECKS)}")
    return fmt


@dataclass
class _Job:
    """Everything one conversion needs, validated."""

    fmt: ModuleType
    partial: Path
    source: Scan
    shard_size: int
    workers: int
    strict: bool
    check: str
    progress: bool


def _shard_starts(shard_of: np.ndarray) -> list[int]:
    """The first sample of every planned shard."""
    return [0, *(np.flatnonzero(np.diff(shard_of)) + 1).tolist()] if len(shard_of) else []


def _convert_shards(job: _Job, done: list[Checkpoint], progress: Progress) -> list[Checkpoint]:
    """Write every shard after the ``done`` ones, checkpointing each as it completes."""
    samples, fmt = job.source.samples, job.fmt
    shard_of, planned = plan_shards([s.size for s in samples], job.shard_size)
    starts = _shard_starts(shard_of)
    # fault tests: "mid-shard-K" fires after the first of K's samples when K holds two or more
    middles = {a for a, b in zip(starts, [*starts[1:], len(samples)]) if b - a >= 2}
    first = starts[len(done)] if len(done) < len(starts) else len(samples)
    for k in range(len(done), len(planned)):  # a half-written shard is rewritten from scratch
        (job.partial / shard_name(k, getattr(fmt, "SUFFIX", ""))).unlink(missing_ok=True)
    todo = samples[first:]
    bar = tqdm(
        total=len(samples),
        initial=first,
        unit="img",
        desc=f"convert → {fmt.NAME}",
        disable=not job.progress,
    )
    current = Checkpoint(None, [], [], [])
    start, done_bytes, last = time.perf_counter(), 0, 0.0
    loaded_iter = load_in_order((s.path for s in todo), job.workers, job.check, fmt.TRANSCODE)
    with fmt.Writer(job.partial, planned) as writer:
        for i, (sample, loaded) in enumerate(zip(todo, loaded_iter), start=first):
            shard = int(shard_of[i])
            if loaded.data is None:
                if job.strict:
                    raise InputFileError(f"{sample.path}: {loaded.reason} (--strict)")
                current.skipped.append({"path": sample.path, "reason": loaded.reason or "?"})
            else:
                offset, length = writer.write(shard, sample.key, sample.label, loaded.data)
                stored = shard if fmt.SHARDED else -1
                current.rows.append([sample.label, stored, offset, length, loaded.checksum])
                current.keys.append(sample.key)
            if i + 1 == len(samples) or shard_of[i + 1] != shard:
                current.shard = writer.finish_shard()
                progress.save(shard, current)
                done.append(current)
                current = Checkpoint(None, [], [], [])
                fault_point(f"after-shard-{shard}")
            elif i in middles:
                fault_point(f"mid-shard-{shard}")
            done_bytes += sample.size
            bar.update(1)
            if job.progress and (now := time.perf_counter()) - last > 0.5:
                bar.set_postfix_str(f"{done_bytes / (now - start) / 1e6:.1f} MB/s")
                last = now
    bar.close()
    return done


def _finalize(job: _Job, done: list[Checkpoint]) -> tuple[Manifest, list[SkippedInput]]:
    """Write index, keys and (last) the manifest from all checkpoints."""
    shards = [c.shard for c in done if c.shard is not None]
    position = {int(s.name[6:11]): n for n, s in enumerate(shards)}  # planned → listed shard
    rows = [r for c in done for r in c.rows]
    index = np.array([tuple(r) for r in rows], dtype=INDEX_DTYPE)
    if job.fmt.SHARDED and len(index):
        index["shard"] = [position[int(k)] for k in index["shard"]]
    skipped = skipped_dicts(job.source.skipped) + [s for c in done for s in c.skipped]
    if not rows:
        raise PackerError(
            f"no usable image in {job.source.root!r}: all {len(job.source.samples)} inputs were skipped"
        )
    keys = [k for c in done for k in c.keys]
    files = {INDEX_NAME: write_index(job.partial, index), KEYS_NAME: write_keys(job.partial, keys)}
    manifest = Manifest(
        format=job.fmt.NAME,
        kind=job.source.kind,
        num_samples=len(rows),
        classes=job.source.classes,
        shards=shards,
        skipped=skipped,
        source={
            "root": job.source.root,
            "files": len(job.source.samples),
            "bytes": job.source.total_bytes,
        },
        options={"shard_size": job.shard_size, "check": job.check},
        files=files,
        layout_version=job.fmt.LAYOUT_VERSION,
    )
    fault_point("before-manifest")
    write_manifest(job.partial, manifest)
    fault_point("after-manifest")
    return manifest, [SkippedInput(s["path"], s["reason"]) for s in skipped]


def publish(partial: Path, dst: Path) -> None:
    """Move the finished ``partial`` into place, replacing an old ``dst`` only at the end."""
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.with_name(dst.name + f".old-{os.getpid()}")
        os.replace(dst, old)
    os.replace(partial, dst)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()


def _disk_full_error(partial: Path, source: Scan) -> DestinationError:
    free = shutil.disk_usage(partial.parent).free
    written = sum(f.stat().st_size for f in partial.rglob("*") if f.is_file())
    needed = max(source.total_bytes - written, 0)
    return DestinationError(
        f"disk full while writing {str(partial)!r}: about {format_size(needed)} more is needed "
        f"and {format_size(free)} is free. The finished shards are kept: free space, then run "
        "the same command with --resume"
    )


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    workers: int | None = None,
    overwrite: bool = False,
    strict: bool = False,
    check: str = "fast",
    resume: bool = False,
    progress: bool = True,
    kind: str | None = None,
    **video_options: Any,
) -> ConvertResult:
    """Convert the image folder ``src`` (``<class>/<image>``) into a packed dataset at ``dst``.

    Args:
        src: the source folder.
        dst: the destination directory; its suffix (.lmdb .h5 .hdf5 .npy .bmp) picks the format.
        format: force a format by name (``lmdb``, ``hdf5``, ``npy``, ``bmp``) whatever the suffix.
        shard_size: roll to a new shard past this many bytes (``"1GiB"``, ``"512MB"``, an int).
        workers: parallel readers (default: the CPU count). The output does not depend on it.
        overwrite: replace an existing ``dst`` (only once the new one is complete).
        strict: make an unusable input file fatal instead of skipping and recording it.
        check: ``"fast"`` (header, verify, JPEG end marker) or ``"decode"`` (decode every pixel).
        resume: continue an interrupted conversion from its last complete shard (``DST.partial``
            must exist and the source and options must be unchanged); the result is identical
            to an uninterrupted run.
        progress: show a tqdm progress bar.
        kind: ``"image"`` (``<class>/<image>``) or ``"video"`` (``<class>/<video>/<frame>`` or
            ``<class>/<video>.mp4``); detected from the tree when None.
        video_options: for video sources, ``quality``, ``max_side``, ``short_side``, ``fps``,
            ``skip_bad_frames`` (see :func:`packer.video.convert.convert_video`).

    Raises:
        PackerError: bad arguments, a bad source or destination, or (with ``strict``) a bad file.
    """
    src_path, dst_path = Path(src), Path(os.fspath(dst).rstrip("/") or "/")
    kind = kind or detect_kind(src_path)
    if kind == "video":
        if resume:
            raise PackerError("--resume is not supported for video sources yet; convert again")
        from packer.video.convert import convert_video  # lazy: it imports this module

        return convert_video(
            src,
            dst,
            format=format,
            shard_size=shard_size,
            workers=workers,
            overwrite=overwrite,
            strict=strict,
            progress=progress,
            **video_options,
        )
    if kind != "image":
        raise PackerError(f"unknown kind {kind!r}; expected image or video")
    if video_options:
        raise PackerError(f"{', '.join(sorted(video_options))} only apply to video sources")
    fmt = _validate(format, dst_path, workers, check)
    size = parse_size(shard_size)
    check_destination(dst_path, overwrite)
    source = scan(src_path)
    if strict and source.skipped:
        raise InputFileError(f"{source.skipped[0].path}: {source.skipped[0].reason} (--strict)")
    partial = dst_path.with_name(dst_path.name + ".partial")
    job = _Job(fmt, partial, source, size, workers or default_workers(), strict, check, progress)
    progress_dir = Progress(partial)
    fp = fingerprint(source, fmt.NAME, {"shard_size": size, "check": check})
    start = time.perf_counter()
    if resume and partial.is_dir():
        done = progress_dir.resume(fp)
    else:
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        progress_dir.start(fp)
        done = []
    try:
        done = _convert_shards(job, done, progress_dir)
        manifest, skipped = _finalize(job, done)
    except OSError as exc:
        if exc.errno == errno.ENOSPC or shutil.disk_usage(partial.parent).free < (1 << 20):
            raise _disk_full_error(partial, source) from exc
        raise DestinationError(f"writing {str(partial)!r} failed: {exc}") from exc
    progress_dir.remove()
    publish(partial, dst_path)
    bytes_out = sum(f.stat().st_size for f in dst_path.rglob("*") if f.is_file())
    return ConvertResult(
        dst=dst_path,
        manifest=manifest,
        seconds=time.perf_counter() - start,
        bytes_in=source.total_bytes,
        bytes_out=bytes_out,
        skipped=skipped,
    )
