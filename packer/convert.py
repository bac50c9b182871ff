"""Convert a source folder into a packed dataset: validate → scan → the one pipeline → publish.

The output is built in ``DST.partial/`` and renamed to ``DST`` only once complete; the manifest
is written last, so its presence means the dataset is whole. Images and video go through the
same pipeline (:mod:`packer.write`); what differs per kind is only how a source is scanned and
how one sample is loaded (``packer.video.convert`` for video).
"""

from __future__ import annotations

import errno
import functools
import os
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packer.check import DEFAULT_CHECK, DEFAULT_MAX_PIXELS
from packer.convert_result import ConvertResult
from packer.cpus import available_cpus
from packer.destination import (
    DestinationLock,
    check_destination,
    check_reach,
    clear_leftovers,
    partial_path,
    publish,
)
from packer.detect import detect, find_splits
from packer.disk_full import disk_full_error
from packer.distributed import check_part, part_path, run_distributed
from packer.errors import DestinationError, InputFileError, PackerError
from packer.finish import Found, find_finished, publish_finished
from packer.formats import by_name, default_layout, format_for
from packer.labels import Labels, class_index_of, one_labels_file
from packer.loading import DEFAULT_MAX_FILE_SIZE
from packer.manifest import Manifest
from packer.prepare import prepare, prepare_split
from packer.resume import Progress, fingerprint, sample_folders
from packer.sizes import parse_size
from packer.sources import SkippedInput, class_dirs
from packer.splits import SplitPlan, convert_splits, plan_splits
from packer.write import Event, Job, Prepared, finalize, plan_shards, write_shards

__all__ = ["DEFAULT_SHARD_SIZE", "ConvertResult", "convert", "convert_video", "plan_shards"]

DEFAULT_SHARD_SIZE = 1 << 30


def _run(
    job: Job,
    partial: Path,
    fp: dict,
    resume: bool,
    options: dict,
    executor: Any = None,
    part: tuple[int, int] | None = None,
) -> Manifest:
    progress = Progress(partial)
    if resume and partial.is_dir():
        done = progress.resume(fp, job.source)
    else:
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        progress.start(fp)
        done = []
    try:
        if executor is None and part is None:
            done = write_shards(job, done, progress)
            manifest, _ = finalize(job, done, options)
        else:
            manifest = run_distributed(job, done, progress, options, fp, executor, part)
    except OSError as exc:
        if exc.errno == errno.ENOSPC or shutil.disk_usage(partial.parent).free < (1 << 20):
            raise disk_full_error(partial, job.source) from exc
        raise DestinationError(f"writing {str(partial)!r} failed: {exc}") from exc
    if part is None:  # a part keeps its checkpoints for packer merge
        progress.remove()
    return manifest


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    workers: int | None = None,
    overwrite: bool = False,
    strict: bool = False,
    check: str = DEFAULT_CHECK,
    resume: bool = False,
    progress: bool = True,
    kind: str | None = None,
    on_event: Event | None = None,
    max_file_size: int | str = DEFAULT_MAX_FILE_SIZE,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    split: str | list[str] | None = None,
    classes: list[str] | None = None,
    labels: Labels | None = None,
    allow_empty: bool = False,
    executor: Any = None,
    part: tuple[int, int] | None = None,
    prepared: Prepared | None = None,
    **video_options: Any,
) -> ConvertResult:
    """Convert the folder ``src`` into a packed dataset at ``dst``.

    Args:
        src: the source folder: ``<class>/<image>``, or for video ``<class>/<video>/<frame>``
            and/or ``<class>/<video>.mp4``.
        dst: the destination directory; its suffix (.lmdb .h5 .hdf5 .npy .bmp) picks the format.
        format: force a format by name (``lmdb``, ``hdf5``, ``npy``, ``bmp``) whatever the suffix.
        shard_size: roll to a new shard past this many bytes (``"1GiB"``, ``"512MB"``, an int);
            also the unit of checkpoints for ``resume``.
        workers: parallel loaders (default: the CPU count). The output does not depend on it.
        overwrite: replace an existing ``dst`` (only once the new one is complete).
        strict: make an unusable input file (or video frame) fatal instead of skipping it.
        check: images: ``"scan"`` (default: header, JPEG end marker, and the whole compressed
            stream walked by a reduced-size decode), ``"fast"`` (no stream walk: ~15× cheaper,
            misses corrupt scan data) or ``"decode"`` (a full decode).
        resume: continue an interrupted conversion from its last complete shard (``DST.partial``
            must exist and the source and options must be unchanged); the result is identical
            to an uninterrupted run.
        progress: show a tqdm progress bar.
        kind: ``"image"`` or ``"video"``; detected from the tree when None.
        on_event: called as ``on_event(name, number)`` as the conversion advances (see
            :class:`packer.write.Job`).
        max_file_size: skip (and list) a source image larger than this, before reading it.
        max_pixels: skip (and list) an image with more pixels than this, before decoding it.
        split: for a source whose top-level folders are splits (``train``, ``val``, ...), the
            split(s) to convert (default: all, into one output; see :mod:`packer.splits`).
        classes: pin the class index (names in label order) instead of taking the folders'.
        labels: a labels file for a flat folder of images (see :mod:`packer.labels`); on a
            root of splits, the labels file of its one flat split (ImageNet's ``val/``), or
            ``{split: file}``.
        allow_empty: keep a class folder without images as a class with no samples.
        executor: run one task per planned shard on it (anything with ``submit``: a
            ``distributed.Client``, a process pool); the output is the same bytes. ``on_event``
            then runs in the tasks (see :mod:`packer.distributed`).
        part: ``(i, n)``: write only the planned shards ``k % n == i``, into ``DST.part-i``,
            for :func:`packer.merge.merge` to join.
        prepared: the source already scanned and checked (a split planned by
            :func:`packer.splits.plan_splits`); ``src``'s kind and labels are then not looked at.
        video_options: for images and video, ``quality``, ``max_side``, ``short_side`` and
            ``reencode`` (write-time resize, :mod:`packer.resize`); for images into ``.npy``,
            ``size`` (decoded size×size pixels, :mod:`packer.pixels`); for video, ``fps``,
            ``skip_bad_frames`` (see :func:`packer.video.convert.prepare_video`).

    Raises:
        PackerError: bad arguments, a bad source or destination, or (with ``strict``) a bad file.
    """
    src_path, dst_path = Path(src), Path(os.fspath(dst).rstrip("/") or "/")
    fmt = by_name(format) if format else format_for(dst_path)
    if workers is not None and workers < 1:
        raise PackerError(f"invalid workers {workers}; expected 1 or more")
    size = parse_size(shard_size)
    limits = {"max_file_size": parse_size(max_file_size), "max_pixels": int(max_pixels)}
    if limits["max_pixels"] < 1:
        raise PackerError(f"invalid max_pixels {max_pixels}; expected 1 or more")
    found = find_splits(src_path) if kind != "video" and prepared is None else []
    wanted = [split] if isinstance(split, str) else list(split or found)
    unknown = [w for w in wanted if w not in found]
    if unknown:
        raise PackerError(
            f"{str(src_path)!r} has no split {unknown[0]!r}"
            + (f"; it has {', '.join(found)}" if found else " (it is not a split root)")
        )
    if wanted:
        if part is not None:
            raise PackerError("--part does not take a root of splits; convert each --split")
        check_destination(dst_path, overwrite, src_path, resume)
        plan = plan_splits(
            src_path,
            wanted,
            functools.partial(prepare_split, fmt, check, limits, video_options, allow_empty),
            labels,
            classes,
            strict,
        )
        options = {
            "format": fmt.NAME,  # a split's folder has no suffix of its own
            "shard_size": shard_size,
            "workers": workers,
            "overwrite": overwrite,
            "strict": strict,
            "check": check,
            "resume": resume,
            "progress": progress,
            "on_event": on_event,
            "max_file_size": max_file_size,
            "max_pixels": max_pixels,
            "allow_empty": allow_empty,
            "executor": executor,
            **video_options,
        }
        return _convert_splits(src_path, dst_path, plan, options)
    file = one_labels_file(labels, src_path) if isinstance(labels, Mapping) else labels
    if part is not None:
        check_part(part)
        dst_path = part_path(dst_path, part[0])
    check_destination(dst_path, overwrite, src_path, resume, published_ok=resume)
    how = "given" if kind else ("a labels file" if file is not None else "detected")
    if kind is None and file is None and prepared is None:
        detection = detect(src_path, class_dirs(src_path))
        kind, how = detection.kind, f"detected: {detection.reason}"
    kind = kind or "image"
    prepared = prepared or prepare(
        kind, src_path, fmt, check, limits, video_options, classes, file, allow_empty
    )
    source = prepared.source
    check_reach(src_path, sample_folders(source), dst_path)
    if strict and source.skipped:
        raise InputFileError(f"{source.skipped[0].path}: {source.skipped[0].reason} (--strict)")
    layout = default_layout(fmt, kind)
    options = {"layout": layout, "shard_size": size, **prepared.options}
    partial = partial_path(dst_path)
    job = Job(
        fmt,
        layout,
        partial,
        source,
        prepared.loader,
        prepared.cpu_bound,
        size,
        workers or available_cpus(),
        strict,
        progress,
        prepared.unit,
        on_event,
        limits["max_file_size"] if kind == "image" else None,
    )
    start = time.perf_counter()
    with DestinationLock(dst_path):
        check_destination(dst_path, overwrite, src_path, resume, published_ok=resume)  # again
        manifest, finished, resumed = _finish(
            job, dst_path, fmt.NAME, options, resume, overwrite, executor, part
        )
    skipped = [SkippedInput(s["path"], s["reason"]) for s in manifest.skipped]
    result = ConvertResult(
        dst=dst_path,
        manifest=manifest,
        seconds=time.perf_counter() - start,
        bytes_in=source.total_bytes,
        bytes_out=sum(f.stat().st_size for f in dst_path.rglob("*") if f.is_file()),
        skipped=skipped,
    )
    result.notes.insert(0, _what_was_found(kind, how, source))
    given = classes is not None
    result.class_index, result.warnings = class_index_of(
        len(source.classes), file, given, kind == "image"
    )
    if finished is not None:
        result.notes.append(_FOUND[finished.published].format(dst=str(dst_path)))
    elif resume and not resumed:
        result.notes.append(f"nothing to resume in {str(partial)!r}: converted from the start")
    return result


_FOUND = {
    True: "{dst!r} is already complete (same source and options): nothing to do",
    False: "{dst!r}: a finished conversion interrupted before publication was published",
}


def _finish(
    job: Job,
    dst: Path,
    fmt_name: str,
    options: dict,
    resume: bool,
    overwrite: bool,
    executor: Any,
    part: tuple[int, int] | None,
) -> tuple[Manifest, Found | None, bool]:
    """Under the lock: publish a finished conversion a kill left (or say it is complete), else
    run the pipeline and publish. Returns the manifest, what was found, whether it resumed."""
    partial = job.partial
    clear_leftovers(dst)
    fp = fingerprint(job.source, fmt_name, options)
    found = find_finished(dst, fp, job.source, resume, overwrite) if part is None else None
    if found is not None:
        publish_finished(found, dst)
        return found.manifest, found, False
    resumed = resume and partial.is_dir()
    manifest = _run(job, partial, fp, resumed, options, executor, part)
    publish(partial, dst)
    return manifest, None, resumed


def _what_was_found(kind: str, how: str, source: Any) -> str:
    """The summary's line saying what the source was taken for, and why."""
    if kind == "video":
        files = sum(1 for v in source.samples if v.is_file)
        return (
            f"video ({how}): {len(source.samples) - files} frame folder(s) and {files} video "
            f"file(s) in {len(source.classes)} classes"
        )
    return f"image classes ({how}): {len(source.classes)}, {len(source.samples)} image file(s)"


def _convert_splits(
    src: Path, dst: Path, plan: SplitPlan, options: dict[str, Any]
) -> ConvertResult:
    start = time.perf_counter()
    manifest, results = convert_splits(src, dst, plan, convert, **options)
    counts = ", ".join(f"{s} {m.num_samples}" for s, m in results.items())
    result = ConvertResult(
        dst=dst,
        manifest=manifest,
        seconds=time.perf_counter() - start,
        bytes_in=sum(int(m.source.get("bytes", 0)) for m in results.values()),
        bytes_out=sum(f.stat().st_size for f in dst.rglob("*") if f.is_file()),
        skipped=[SkippedInput(x["path"], x["reason"]) for m in results.values() for x in m.skipped],
    )
    result.notes.append(
        f"image classes: {len(manifest.classes)} in splits {', '.join(plan.splits)} ({counts}); "
        f"one class index, from {manifest.options['class_index_from']!r}"
    )
    detail = plan.describe()
    result.class_index = {"source": "splits", "detail": detail, "splits": plan.index_of}
    return result


def convert_video(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], **kwargs: Any
) -> ConvertResult:
    """Convert a video tree: :func:`convert` with ``kind="video"`` (same arguments)."""
    return convert(src, dst, kind="video", **kwargs)
