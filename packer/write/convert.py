"""Convert a source folder into a packed dataset: validate → scan → the one pipeline → publish.

The output is built in ``DST.partial/`` and renamed to ``DST`` only once complete; the manifest
is written last, so its presence means the dataset is whole. Images and video go through the
same pipeline (:mod:`packer.write.pipeline`); what differs per kind is only how a source is scanned and
how one sample is loaded (``packer.write.video`` for video).
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from typing import Any

from packer.core.manifest import Manifest
from packer.errors import DestinationError
from packer.remote.storage import is_url
from packer.source.images import SkippedInput
from packer.source.labels import class_index_of
from packer.source.links import OUTSIDE
from packer.write.destination import DestinationLock, check_destination, clear_leftovers, publish
from packer.write.disk_full import check_room, disk_full_error
from packer.write.finish import Found, find_finished, publish_finished
from packer.write.options import ConvertOptions, options_of
from packer.write.pipeline import finalize, plan_shards, write_shards
from packer.write.plan import DEFAULT_SHARD_SIZE, ConversionPlan, plan_conversion
from packer.write.result import ConvertResult
from packer.write.resume import Progress, fingerprint, unstarted
from packer.write.splits import build_splits
from packer.write.tasks import run_distributed

__all__ = [
    "DEFAULT_SHARD_SIZE",
    "ConvertOptions",
    "ConvertResult",
    "convert",
    "convert_video",
    "plan_shards",
]


def _run(plan: ConversionPlan, fp: dict, resume: bool) -> Manifest:
    """Write the output into ``DST.partial`` (resuming it, or from scratch) and return its
    manifest; a full disk or a failed write is a :class:`DestinationError`."""
    job, partial, part = plan.job(), plan.partial, plan.settings.part
    progress = Progress(partial)
    settings = plan.settings
    if settings.after_shard is None:  # else shards leave as they finish (an upload's staging)
        check_room(partial, plan.format, job.source, plan.options, resume)
    try:
        if resume and partial.is_dir():
            done = progress.resume(fp, job.source)
        else:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir()
            progress.start(fp)
            done = []
        if settings.executor is None and part is None:
            done = write_shards(job, done, progress)
            manifest, _ = finalize(job, done, plan.options)
        else:
            manifest = run_distributed(
                job, done, progress, plan.options, fp, settings.executor, part
            )
    except OSError as exc:
        if exc.errno == errno.ENOSPC or shutil.disk_usage(partial.parent).free < (1 << 20):
            raise disk_full_error(partial, job.source, plan.format, plan.options) from exc
        raise DestinationError(f"writing {str(partial)!r} failed: {exc}") from exc
    if part is None:  # a part keeps its checkpoints for packer merge
        progress.remove()
    return manifest


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    options: ConvertOptions | None = None,
    **keywords: Any,
) -> ConvertResult:
    """Convert the folder ``src`` into a packed dataset at ``dst``.

    The options below are given as keywords, as ``options`` (a :class:`packer.ConvertOptions`
    holding them, typed: :mod:`packer.write.options`), or both (the keywords then replace the
    options they name); each is checked as the options are built, before any work: a wrong type
    or an unknown name is a :class:`PackerError` naming it.

    Args:
        src: the source folder: ``<class>/<image>``, or for video ``<class>/<video>/<frame>``
            and/or ``<class>/<video>.mp4``.
        dst: the destination directory; its suffix (.lmdb .h5 .hdf5 .npy .bmp) picks the format.
            For a URL (``s3://bucket/out.lmdb``) use :func:`packer.upload.staging.convert_to_url`.
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
            :class:`packer.write.pipeline.Job`).
        max_file_size: skip (and list) a source image larger than this, before reading it.
        max_pixels: skip (and list) an image with more pixels than this, before decoding it.
        split: for a source whose top-level folders are splits (``train``, ``val``, ...), the
            split(s) to convert (default: all, into one output; see :mod:`packer.write.splits`).
        classes: pin the class index (names in label order) instead of taking the folders'.
        labels: a labels file for a flat folder of images (see :mod:`packer.source.labels`); on a
            root of splits, the labels file of its one flat split (ImageNet's ``val/``), or
            ``{split: file}``.
        allow_empty: keep a class folder without images as a class with no samples.
        executor: run one task per planned shard on it (anything with ``submit``: a
            ``distributed.Client``, a process pool); the output is the same bytes. ``on_event``
            then runs in the tasks (see :mod:`packer.write.tasks`).
        part: ``(i, n)``: write only the planned shards ``k % n == i``, into ``DST.part-i``,
            for :func:`packer.write.merge.merge` to join.
        after_shard: called as ``after_shard(job, shard, checkpoint)`` once each planned
            shard is durable and checkpointed, in the converting process (not with
            ``executor`` or ``part``); :func:`packer.upload.staging.convert_to_url` uploads it then.
        source_options: fsspec options (``endpoint_url``, ...) of a URL ``src``: WebDataset
            tars at a URL are fetched into a local folder first (:mod:`packer.remote.fetch`).
        follow_links: a source with fields (key-grouped files, a table, COCO, tars) reads a
            file or folder through a link whose target leaves the source; without it such a
            sample is skipped and listed (:mod:`packer.source.links`). Class and video trees
            always follow links, as ``ImageFolder`` does.
        quality, max_side, short_side, reencode: for images and video, the write-time resize
            (:mod:`packer.decode.resize`).
        size: for images into ``.npy``, decoded size×size pixels (:mod:`packer.decode.pixels`).
        fps, skip_bad_frames: for video (see :func:`packer.write.video.prepare_video`).
        require, image_column, annotations: for samples with fields, the fields a sample must
            have, a table's image column, COCO's annotation files.

    Raises:
        PackerError: bad arguments, a bad source or destination, or (with ``strict``) a bad file.
    """
    settings = options_of(options, keywords)  # every option checked, before any work
    if is_url(dst):
        raise DestinationError(
            f"convert() writes a local folder, not the URL {dst!r}: use "
            "packer.convert_to_url(src, url, storage_options=...), which builds the output in a "
            "local staging folder and uploads it (the CLI does so for packer convert SRC URL)"
        )
    plan = plan_conversion(src, dst, options=settings)
    return _convert_splits(plan) if plan.splits is not None else _convert_folder(plan)


def _convert_folder(plan: ConversionPlan) -> ConvertResult:
    """Run a single folder's plan under its destination's lock; summarize the result."""
    start = time.perf_counter()
    manifest, finished, resumed = _finish(plan)
    assert plan.prepared is not None
    source = plan.prepared.source
    result = ConvertResult(
        dst=plan.dst,
        manifest=manifest,
        seconds=time.perf_counter() - start,
        bytes_in=source.total_bytes,
        bytes_out=sum(f.stat().st_size for f in plan.dst.rglob("*") if f.is_file()),
        skipped=[SkippedInput(s["path"], s["reason"]) for s in manifest.skipped],
    )
    result.notes.insert(0, _what_was_found(plan.kind, plan.how, source))
    outside = sum(1 for s in result.skipped if OUTSIDE in s.reason)
    if outside:
        result.notes.append(
            f"{outside} input(s) skipped as {OUTSIDE}: not followed; --follow-links "
            "(follow_links=True) reads them"
        )
    given = plan.settings.classes is not None
    result.class_index, result.warnings = class_index_of(
        len(source.classes), plan.labels_file, given, plan.kind == "image"
    )
    if finished is not None:
        result.notes.append(_FOUND[finished.published].format(dst=str(plan.dst)))
    elif plan.resume and not resumed:
        result.notes.append(f"nothing to resume in {str(plan.partial)!r}: converted from the start")
    return result


_FOUND = {
    True: "{dst!r} is already complete (same source and options): nothing to do",
    False: "{dst!r}: a finished conversion interrupted before publication was published",
}


def _finish(plan: ConversionPlan) -> tuple[Manifest, Found | None, bool]:
    """Under the destination's lock: publish a finished conversion a kill left (or say it is
    complete), else run the pipeline and publish. Returns the manifest, what was found,
    whether it resumed."""
    with DestinationLock(plan.dst):
        return _finish_locked(plan)


def _finish_locked(plan: ConversionPlan) -> tuple[Manifest, Found | None, bool]:
    dst, partial, resume, overwrite = plan.dst, plan.partial, plan.resume, plan.settings.overwrite
    check_destination(dst, overwrite, plan.src, resume, published_ok=resume)  # again
    clear_leftovers(dst)
    source = plan.prepared.source if plan.prepared is not None else None
    fp = fingerprint(source, plan.format, plan.options)
    found = None
    if plan.settings.part is None:
        found = find_finished(dst, fp, source, resume, overwrite)
    if found is not None:
        publish_finished(found, dst)
        return found.manifest, found, False
    resumed = resume and partial.is_dir() and not unstarted(partial)  # else started afresh
    manifest = _run(plan, fp, resumed)
    publish(partial, dst)
    return manifest, None, resumed


def _what_was_found(kind: str, how: str, source: Any) -> str:
    """The summary's line saying what the source was taken for, and why."""
    if source.kind == "fields":
        fields = ", ".join(f"{f.name} ({f.kind})" for f in source.fields)
        return (
            f"samples with fields ({how}, source {source.source_kind}): "
            f"{len(source.samples)} sample(s); fields {fields}"
        )
    if kind == "video":
        files = sum(1 for v in source.samples if v.is_file)
        return (
            f"video ({how}): {len(source.samples) - files} frame folder(s) and {files} video "
            f"file(s) in {len(source.classes)} classes"
        )
    return f"image classes ({how}): {len(source.classes)}, {len(source.samples)} image file(s)"


def _convert_splits(plan: ConversionPlan) -> ConvertResult:
    """Convert each split of a root of splits with its own plan, into one output."""
    start = time.perf_counter()
    splits = plan.splits
    assert splits is not None
    fp = plan.splits_fingerprint()
    overwrite = plan.settings.overwrite
    with build_splits(plan.src, plan.dst, splits, fp, overwrite, plan.resume) as build:
        for name, dst, resume in build.todo():
            build.done(name, _finish(plan.for_split(name, dst, resume))[0])
    dst, results, manifest = plan.dst, build.results, build.manifest
    assert manifest is not None
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
        f"image classes: {len(manifest.classes)} in splits {', '.join(splits.splits)} ({counts}); "
        f"one class index, from {manifest.opts.class_index_from!r}"
    )
    detail = splits.describe()
    result.class_index = {"source": "splits", "detail": detail, "splits": splits.index_of}
    return result


def convert_video(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], **kwargs: Any
) -> ConvertResult:
    """Convert a video tree: :func:`convert` with ``kind="video"`` (same arguments)."""
    return convert(src, dst, kind="video", **kwargs)
