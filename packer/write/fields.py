"""The fields part of a conversion: load a sample with fields into one record per field.

:func:`load_fields` reads each of a sample's parts (a whole file, a byte range of a tar, a value
in memory), checks it by its field's kind — an image as every image is checked (``--check``),
text as UTF-8, JSON parsed, an ``int`` field (``cls``) as a decimal integer, an array as an
``.npy`` header — and returns the records in the dataset's field order, an absent field as no
bytes with checksum :data:`~packer.core.fields.ABSENT`. One bad field skips its sample, the
field and the reason named. Stored bytes are the source's bytes, unchanged (unless the one
image field is resized at write time: ``--short-side``/``--max-side``, recorded).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from packer.core.fields import ABSENT, check_field_name
from packer.core.manifest import bytes_checksum
from packer.decode.resize import Resize
from packer.decode.values import check_value
from packer.errors import InputFileError, PackerError
from packer.source.audio import scan_audio
from packer.source.coco import scan_coco
from packer.source.grouped import scan_grouped
from packer.source.json_bounded import INT64
from packer.source.samples import FieldSample, FieldScan, Part
from packer.source.tables import scan_table
from packer.source.tars import scan_tars
from packer.write.loading import DEFAULT_MAX_FILE_SIZE, Loaded, read_input
from packer.write.options import ConvertOptions, FieldOptions, Limits, given
from packer.write.pipeline import Prepared

__all__ = [
    "FIELD_OPTIONS",
    "FIELD_SOURCES",
    "load_fields",
    "prepare_fields",
    "read_part",
    "scan_fields",
]

FIELD_OPTIONS = ("require", "image_column", "annotations")  # the sources' own options
assert set(FIELD_OPTIONS) < {f.name for f in dataclasses.fields(FieldOptions)}
# the kinds of source whose samples have fields
FIELD_SOURCES = ("files", "tars", "table", "coco", "audio")


def scan_fields(kind: str, src: Path, options: FieldOptions) -> FieldScan:
    """Scan source ``src`` of ``kind`` (one of FIELD_SOURCES) with its options.

    Raises:
        PackerError: an unknown kind, a bad option or a source that cannot be scanned.
    """
    required = [check_field_name(r, "--require") for r in options.require]
    if kind == "files":
        return scan_grouped(src, required)
    if kind == "tars":
        return scan_tars(src, required, options.follow_links)
    if kind == "table":
        return scan_table(src, options.image_column, required)
    if kind == "coco":
        return scan_coco(src, list(options.annotations), required)
    if kind == "audio":
        return scan_audio(src, required)
    raise PackerError(f"unknown kind {kind!r}; expected one of {', '.join(FIELD_SOURCES)}")


def read_part(
    part: Part, max_bytes: int = DEFAULT_MAX_FILE_SIZE, opened: dict[str, int] | None = None
) -> bytes:
    """The bytes of one part: its value, its whole file, or its byte range of a file (a
    descriptor of that file kept in ``opened``, when given, for the sample's other parts: the
    caller closes them).

    Raises:
        InputFileError: the file cannot be read, is over ``max_bytes``, or changed size since
            the scan.
    """
    if part.data is not None:
        return part.data
    if part.offset < 0:
        data = read_input(part.path, max_bytes)
    else:
        if part.size > max_bytes:
            raise InputFileError(f"{part.size / 1e6:.1f} MB, over the limit (--max-file-size)")
        keep = opened if opened is not None else {}
        try:
            fd = keep.get(part.path)
            if fd is None:
                fd = keep[part.path] = os.open(
                    part.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK
                )
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise InputFileError("not a regular file")
            data = os.pread(fd, part.size, part.offset)
        except OSError as exc:
            raise InputFileError(f"cannot read: {exc.strerror or exc}") from exc
        finally:
            if opened is None:
                _close(keep)
    if len(data) != part.size:
        raise InputFileError(
            f"changed during the conversion ({part.size} bytes scanned, {len(data)} read); "
            "convert again once it is complete"
        )
    return data


def _close(opened: dict[str, int]) -> None:
    for fd in opened.values():
        os.close(fd)
    opened.clear()


def load_fields(
    sample: FieldSample,
    names: Sequence[str],
    kinds: Sequence[str],
    check: str = "fast",
    limits: Limits | None = None,
    resize: Resize | None = None,
) -> Loaded:
    """One sample's records, one per field of ``names`` (absent: no bytes, checksum 0), or
    the reason it cannot be used (an image field over ``limits.max_pixels`` among them)."""
    limits = limits or Limits()
    max_file_size, max_pixels = limits.max_file_size, limits.max_pixels
    by_field = {p.field: p for p in sample.parts}
    records: list[bytes] = []
    sums: list[int] = []
    opened: dict[str, int] = {}  # a tar's members read through one descriptor
    try:
        for name, kind in zip(names, kinds):
            part = by_field.get(name)
            if part is None:
                records.append(b"")
                sums.append(ABSENT)
                continue
            try:
                data = read_part(part, max_file_size, opened)
                check_value(data, kind, check, max_pixels)
                if kind == "int" and not INT64[0] <= int(bytes(data).strip()) <= INT64[1]:
                    raise InputFileError(f"an integer outside int64 ({bytes(data)[:40]!r})")
                if kind == "image" and resize is not None:
                    data = resize.apply(data)
            except InputFileError as exc:
                return Loaded(None, f"field {name!r}: {exc}")
            records.append(data)
            sums.append(bytes_checksum(data))
    finally:
        _close(opened)
    return Loaded(records, checksums=sums)


def prepare_fields(scan: FieldScan, fmt: ModuleType, options: ConvertOptions) -> Prepared:
    """The conversion's part for a scanned source of samples with fields.

    Raises:
        PackerError: a format or option that cannot hold these fields honestly (BMP, --size,
            video options, a resize with two image fields or with COCO's pixel coordinates).
    """
    if "shards" not in fmt.LAYOUTS:
        raise PackerError(
            f"{fmt.NAME.upper()} stores one decoded image per file: samples with fields need "
            ".lmdb, .npy or .h5 (their image fields keep their bytes)"
        )
    if options.size is not None:
        raise PackerError(
            "--size stores decoded pixels of class-folder images; samples with fields keep "
            "their images' bytes (use --short-side/--max-side to make them smaller)"
        )
    video_only = sorted(given(options.video))
    if video_only:
        raise PackerError(f"{', '.join(video_only)} only apply to video sources")
    check, resize = options.check, options.resize
    images = [f.name for f in scan.fields if f.kind == "image"]
    recorded: dict[str, Any] = {
        "check": check,
        **dataclasses.asdict(options.limits),
        "fields": [f.to_dict() for f in scan.fields],
        "source_kind": scan.source_kind,
        **scan.recorded,
    }
    if resize.active:
        if scan.source_kind == "coco" or len(images) != 1:
            why = (
                "its annotations hold pixel coordinates (boxes, polygons)"
                if scan.source_kind == "coco"
                else f"it has {len(images)} image fields ({', '.join(images) or 'none'}): "
                "a mask or second image would no longer match"
            )
            raise PackerError(
                f"--short-side/--max-side/--quality/--reencode would resize this source's "
                f"images but {why}; convert without them"
            )
        recorded["resize"] = resize.recorded()
    loader = functools.partial(
        load_fields,
        names=tuple(f.name for f in scan.fields),
        kinds=tuple(f.kind for f in scan.fields),
        check=check,
        resize=resize if resize.active else None,
        limits=options.limits,
    )
    clips = any(f.kind == "audio" for f in scan.fields)  # a clip's check decodes its stream
    cpu_bound = resize.active or (check != "fast" and bool(images or clips))
    return Prepared(scan, loader, cpu_bound, recorded, "samples")
