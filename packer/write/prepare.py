"""The image part of a conversion: validate the image options, scan the source (class tree or
flat folder + labels file) and return the loader the pipeline runs (:class:`packer.write.pipeline.Prepared`).

Video has its own part (:func:`packer.write.video.prepare_video`); :func:`prepare` picks one.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from packer.decode.check import CHECKS
from packer.decode.pixels import to_pixels
from packer.errors import PackerError
from packer.source.audio import looks_audio_tree, scan_audio
from packer.source.images import scan
from packer.source.labels import read_labels, scan_flat
from packer.write.fields import FIELD_SOURCES, prepare_fields, scan_fields
from packer.write.loading import load_image, load_source_files
from packer.write.options import ConvertOptions, given
from packer.write.pipeline import Prepared

__all__ = ["prepare", "prepare_images", "prepare_split"]


def prepare_images(
    src: Path,
    fmt: ModuleType,
    options: ConvertOptions,
    classes: list[str] | None = None,
    labels: str | os.PathLike[str] | None = None,
    index_from: str = "the given index",
) -> Prepared:
    check, size, resize = options.check, options.size, options.resize
    video_only = sorted(given(options.video))
    if video_only:
        raise PackerError(f"{', '.join(video_only)} only apply to video sources")
    transcode = fmt.TRANSCODE
    recorded: dict[str, Any] = {"check": check, **dataclasses.asdict(options.limits)}
    if resize.active:
        recorded["resize"] = resize.recorded()
    if size is not None:
        if fmt.NAME != "npy" or resize.active:
            raise PackerError(
                "--size stores decoded size×size pixels: it needs a .npy destination and no "
                "--short-side/--max-side/--quality/--reencode"
            )
        if not 1 <= size <= 4096:
            raise PackerError(f"invalid size {size!r}; expected 1..4096 pixels")
        transcode = functools.partial(to_pixels, size=size)
        recorded["pixels"] = [size, size, 3]
    loader = functools.partial(
        load_image, check=check, transcode=transcode, resize=resize, limits=options.limits
    )
    # A decode (the scan check's, a resize's, a transcode's) holds the GIL for ~1/4 of its time
    # (Pillow's Python around libjpeg): a process pool, not threads, keeps every core on it.
    cpu_bound = transcode is not None or resize.active or check != "fast"
    if labels is not None:
        tokens = read_labels(labels)
        name = os.path.basename(labels)
        source = scan_flat(src, tokens, classes, labels_name=name, index_from=index_from)
    else:
        source = scan(src, classes=classes, allow_empty=options.allow_empty)
    return Prepared(source, loader, cpu_bound, recorded, "img")


def prepare(
    kind: str,
    src: Path,
    fmt: ModuleType,
    options: ConvertOptions,
    classes: list[str] | None,
    labels: str | os.PathLike[str] | None,
    index_from: str = "the given index",
) -> Prepared:
    """The kind's part of a conversion (``classes``: the class index, the given one or a root of
    splits' shared one; ``index_from``: where it came from, for the error naming a label the
    index does not know). A source with fields reads a file through a link leaving its root
    only with ``follow_links`` (:mod:`packer.source.links`); class and video trees always
    follow links, as ImageFolder does."""
    if options.check not in CHECKS:
        raise PackerError(f"invalid check {options.check!r}; expected one of {', '.join(CHECKS)}")
    fields = options.fields
    if kind in FIELD_SOURCES:
        if classes is not None or labels is not None:
            raise PackerError(
                "--labels, --classes and splits apply to class-folder images, not to samples "
                f"with fields (--kind {kind})"
            )
        scanned = scan_fields(kind, src, fields)
        return _within_source(prepare_fields(scanned, fmt, options), options)
    named = sorted(k for k in given(fields) if k != "follow_links")
    if named:
        raise PackerError(
            f"{', '.join('--' + g.replace('_', '-') for g in named)} applies to samples with "
            f"fields (--kind {', '.join(FIELD_SOURCES)}), not to {kind} class folders"
        )
    if kind == "image" or labels is not None:
        return prepare_images(src, fmt, options, classes, labels, index_from)
    if classes is not None:
        raise PackerError("splits (a shared class index) are supported for images only so far")
    if kind == "video":
        from packer.write.video import prepare_video

        return prepare_video(src, fmt, options)
    raise PackerError(
        f"unknown kind {kind!r}; expected one of image, video, {', '.join(FIELD_SOURCES)}"
    )


def _within_source(prepared: Prepared, options: ConvertOptions) -> Prepared:
    """``prepared`` whose loader reads each field file beneath the source's root (a link
    leaving it followed only with ``follow_links``, then recorded in the options)."""
    follow_links = options.fields.follow_links
    loader = functools.partial(
        load_source_files,
        loader=prepared.loader,
        root=prepared.source.root,
        follow_links=follow_links,
        max_file_size=options.limits.max_file_size,
    )
    recorded = {**prepared.options, **({"follow_links": True} if follow_links else {})}
    return dataclasses.replace(prepared, loader=loader, options=recorded)


def prepare_split(
    fmt: ModuleType,
    options: ConvertOptions,
    folder: Path,
    classes: list[str],
    labels: str | None,
    index_from: str,
) -> Prepared:
    """One split's image part, for :func:`packer.write.splits.plan_splits` (a split of class
    folders of audio clips: its samples of fields, labelled by the shared class index)."""
    if labels is None and looks_audio_tree(folder):
        scanned = scan_audio(folder, classes=classes)
        unfollowed = dataclasses.replace(
            options, fields=dataclasses.replace(options.fields, follow_links=False)
        )
        return _within_source(prepare_fields(scanned, fmt, options), unfollowed)
    return prepare("image", folder, fmt, options, classes, labels, index_from)
