"""Scan the Parquet or Arrow files of a Hugging Face dataset into samples, batch by batch.

Each file is read one record batch at a time (a Parquet row group, an Arrow IPC message), so a
scan holds one batch's columns whatever the file's size; an image's bytes are not kept, only
where they are: a byte range of an Arrow file (whose buffers are the file's bytes, mapped), or a
:class:`RowPart` — row ``row`` of row group ``group`` of a Parquet file, read again when the
sample is loaded (:mod:`packer.write.hf`). An image whose ``bytes`` are null and ``path`` is
given is that file, relative to the table's folder.

A table of one image column and one ClassLabel scans into an image :class:`Scan` (kind
``image``, the ClassLabel's names as ``classes``, in their order), read as ``(image, label)``
like a class tree; any other table into a :class:`FieldScan` (every column a field of its
kind, see :mod:`packer.source.hf_features`). A sample's key is its file's name without the
suffix and its row number (``train-00000-of-00001/000000042``).

Skipped, each with its reason: a null image, an image with neither bytes nor a path, a path
that is absolute, climbs out of the table's folder or names no file, empty bytes, a null or
``-1`` label (an image table), a label outside the ClassLabel's names, a cell that is not UTF-8.
Bytes that are not an image are skipped when the sample is loaded (the image check).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.errors import SourceError
from packer.source.hf_features import Column, columns_of
from packer.source.images import Scan, SkippedInput
from packer.source.json_bounded import dumps_utf8, inside_path, plain_text, text_value
from packer.source.samples import FieldSample, FieldScan, Part, finish_scan, why_none

__all__ = ["HFImage", "RowPart", "scan_hf"]


@dataclass(frozen=True, slots=True)
class RowPart(Part):
    """The bytes of row ``row`` of row group ``group`` of Parquet file ``path``, column
    ``column`` (a struct's ``bytes``), ``size`` bytes long."""

    column: str = ""
    group: int = 0
    row: int = 0


@dataclass(frozen=True, slots=True)
class HFImage:
    """One image of an image-and-ClassLabel table: its key, label, where it is named in skip
    reasons (``path``: ``file[row]``), its size and its :class:`Part`."""

    key: str
    label: int
    path: str
    size: int
    part: Part

    @property
    def files(self) -> tuple[str, ...]:
        """The files the sample is read from (for ``--resume``'s fingerprint)."""
        return (self.part.path,)


def _batches(path: str, columns: list[str]) -> Iterator[tuple[int, Any, int | None]]:
    """``(group, batch, base)`` for each record batch of ``path``: a Parquet file's row groups
    (``base`` None), an Arrow stream's messages (``base``: the address of the mapped file, its
    batches' buffers lie in it).

    Raises:
        SourceError: the file cannot be read.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.lower().endswith(".parquet"):
            pf = pq.ParquetFile(path)
            for group in range(pf.num_row_groups):
                table = pf.read_row_group(group, columns=columns)
                yield (
                    group,
                    table.combine_chunks().to_batches()[0] if table.num_rows else None,
                    None,
                )
            return
        with pa.memory_map(path) as mm:
            base = mm.read_buffer(mm.size()).address if mm.size() else 0
            mm.seek(0)
            for group, batch in enumerate(pa.ipc.open_stream(mm)):
                yield group, batch, base
    except SourceError:
        raise
    except Exception as exc:  # ArrowInvalid, OSError: a truncated or damaged file
        raise SourceError(f"{path!r} cannot be read: {exc}") from exc


def _ranges(array: Any, base: int, size: int, path: str) -> list[int]:
    """The file offset of each value of an Arrow binary ``array`` read from a mapped file.

    Raises:
        SourceError: the values are not the file's bytes (a compressed Arrow file).
    """
    import numpy as np
    import pyarrow as pa

    _, offsets_buf, data = array.buffers()
    wide = pa.types.is_large_binary(array.type)
    offsets = np.frombuffer(offsets_buf, dtype="<i8" if wide else "<i4")
    offsets = offsets[array.offset : array.offset + len(array) + 1]
    start = 0 if data is None else data.address - base
    if data is not None and not 0 <= start <= start + data.size <= size:
        raise SourceError(
            f"{path!r}: its image bytes are not stored as they are (a compressed Arrow file); "
            "save it again without compression, or as Parquet"
        )
    return [start + int(o) for o in offsets[:-1]]


@dataclass
class _File:
    """One file being scanned: its path, folder, key prefix, columns."""

    path: str
    folder: str
    stem: str
    columns: list[Column]


def _image_part(f: _File, name: str, cell: Any, group: int, row: int, at: int | None) -> Any:
    """The :class:`Part` of an image cell (``at``: its offset in an Arrow file), or why not."""
    if cell is None:
        return "no image (null)"
    data_len, rel = cell
    if data_len is not None:
        if data_len == 0:
            return "empty image bytes"
        if at is not None:
            return Part(name, f.path, data_len, offset=at)
        return RowPart(name, f.path, data_len, column=name, group=group, row=row)
    if not isinstance(rel, str) or not rel.strip():
        return "an image with neither bytes nor a path"
    try:
        inside_path(rel, "its image path", "image path {!r} climbs out of the table's folder")
    except ValueError as exc:
        return str(exc)
    full = os.path.join(f.folder, rel)
    try:
        size = os.stat(full).st_size
    except OSError as exc:
        return f"image {rel!r}: {exc.strerror}"
    if not os.path.isfile(full):
        return f"image {rel!r} is not a file"
    return Part(name, full, size)


def _encode(column: Column, value: Any) -> bytes:
    if column.kind == "bytes":
        return bytes(value)
    if column.kind in ("int", "label"):
        return str(int(value)).encode()
    value = text_value(value)
    if column.kind == "text" and isinstance(value, str):
        return plain_text(value, "its text", nul=True)
    return dumps_utf8(value, "its value")


def _cells(batch: Any, columns: list[Column], base: int | None, size: int, path: str) -> dict:
    """Each column of ``batch`` as a list of Python values; an image column as ``(length of
    bytes or None, path)`` pairs, with ``name + '@'`` the offsets (Arrow files)."""
    import pyarrow.compute as pc

    out: dict[str, Any] = {}
    for c in columns:
        array = batch.column(c.name)
        if c.kind in ("image", "audio"):
            raw = array.field("bytes")
            lengths = pc.binary_length(raw).to_pylist()
            paths = array.field("path").to_pylist()
            valid = array.is_valid().to_pylist()
            out[c.name] = [(n, p) if ok else None for n, p, ok in zip(lengths, paths, valid)]
            if base is not None:
                out[c.name + "@"] = _ranges(raw, base, size, path)
        else:
            out[c.name] = array.to_pylist()
    return out


def _row(f: _File, cells: dict, i: int, group: int, row: int) -> list[Part] | str:
    """The parts of one row (every column with a value), or why the row is skipped."""
    parts: list[Part] = []
    for c in f.columns:
        value = cells[c.name][i]
        if c.kind in ("image", "audio"):
            offsets = cells.get(c.name + "@")
            got = _image_part(f, c.name, value, group, i, offsets[i] if offsets else None)
            if isinstance(got, str):
                if value is None and c.kind == "audio":
                    continue  # an absent field
                return got if c.kind == "image" else f"column {c.name!r}: {got}"
            parts.append(got)
        elif value is not None:
            if c.kind == "label" and not -1 <= value < len(c.names):
                return f"label {value} outside the {len(c.names)} names of ClassLabel {c.name!r}"
            try:
                data = _encode(c, value)
            except ValueError as exc:
                return f"column {c.name!r}: {exc}"
            parts.append(Part(c.name, f.path, len(data), data=data))
    return parts


def _image_sample(f: _File, parts: list[Part] | str, labels: list[Any], i: int, at: str) -> Any:
    if isinstance(parts, str):
        return parts
    label_column = next(c for c in f.columns if c.kind == "label")
    image = next(p for p in parts if p.field != label_column.name)  # the image is never absent
    label = labels[i]
    if label is None or label < 0:
        return f"no label ({label_column.name} is {'null' if label is None else label})"
    return image, int(label)


def scan_files(
    files: list[str], features: dict[str, Any] | None, kind: str
) -> tuple[list[Any], list[SkippedInput], list[Column]]:
    """The samples of every file (``kind``: ``image`` or ``fields``), the rows skipped, and the
    columns of the first file (every file must have the same)."""
    samples: list[Any] = []
    skipped: list[SkippedInput] = []
    first: list[Column] | None = None
    for path in files:
        schema_cols = _file_columns(path, features)
        if first is None:
            first = schema_cols
        elif schema_cols != first:
            raise SourceError(
                f"{path!r} has other columns or features than {files[0]!r}: the files of one "
                "split must share their features"
            )
        used = [c for c in first if c.kind != "none"]
        f = _File(path, os.path.dirname(path), Path(path).stem, used)
        number = 0
        size = os.path.getsize(path)
        for group, batch, base in _batches(path, [c.name for c in used]):
            if batch is None:
                continue
            cells = _cells(batch, used, base, size, path)
            for i in range(batch.num_rows):
                at, key = f"{path}[{number}]", f"{f.stem}/{number:09d}"
                number += 1
                parts = _row(f, cells, i, group, i)
                if kind == "image":
                    label = next(c.name for c in used if c.kind == "label")
                    got = _image_sample(f, parts, cells[label], i, at)
                    if isinstance(got, str):
                        skipped.append(SkippedInput(at, got))
                    else:
                        samples.append(HFImage(key, got[1], at, got[0].size, got[0]))
                elif isinstance(parts, str):
                    skipped.append(SkippedInput(at, parts))
                else:
                    total = sum(p.size for p in parts)
                    samples.append(FieldSample(key, at, total, tuple(parts)))
    return samples, skipped, first or []


def _file_columns(path: str, features: dict[str, Any] | None) -> list[Column]:
    from packer.source.hf_features import schema_of

    return columns_of(schema_of(path), features or None, repr(path))


def table_kind(columns: list[Column]) -> str:
    """``image`` for one image column and one ClassLabel (and nothing else), else ``fields``."""
    kinds = sorted(c.kind for c in columns if c.kind != "none")
    return "image" if kinds == ["image", "label"] else "fields"


def scan_hf(
    files: list[str],
    features: dict[str, Any] | None = None,
    classes: list[str] | None = None,
    required: list[str] | None = None,
) -> Scan:
    """Scan the files of one dataset (or one split) into an image :class:`Scan` or a
    :class:`FieldScan` (see the module docstring); ``classes``: the class index the labels must
    agree with (a DatasetDict's, from its training split).

    Raises:
        SourceError: a file that cannot be read, files with other features, no usable row,
            ClassLabel names other than ``classes``, a column name that is not a field name.
    """
    where = (
        repr(files[0])
        if len(files) == 1
        else f"{len(files)} files in {os.path.dirname(files[0])!r}"
    )
    columns = _file_columns(files[0], features)
    kind = table_kind(columns)
    labels = [c for c in columns if c.kind == "label"]
    names = list(labels[0].names) if len(labels) == 1 else []
    if classes is not None and names != list(classes):
        raise SourceError(
            f"{where}: ClassLabel {labels[0].name if labels else '(none)'!r} names "
            f"{len(names)} classes, not the {len(classes)} of the class index (the training "
            "split's): the labels would disagree; give every split the same ClassLabel"
        )
    samples, skipped, columns = scan_files(files, features, kind)
    root = str(Path(files[0]).parent.resolve())
    if not samples:
        raise SourceError(f"{where} holds no usable row: {why_none(skipped)}")
    left_out = {c.name: c.why for c in columns if c.kind == "none"}
    if kind == "image":
        scan = Scan(root=root, kind="image", classes=names, samples=samples, skipped=skipped)
        scan.source_kind = "hf"  # type: ignore[attr-defined]
        return scan
    fields = FieldScan(root=root, kind="fields", classes=names, samples=[], skipped=skipped)
    fields.source_kind = "hf"
    fields.recorded = {"hf_features": {c.name: c.kind for c in columns}}
    fields.recorded["class_names"] = {c.name: list(c.names) for c in columns if c.kind == "label"}
    if left_out:
        fields.recorded["hf_left_out"] = left_out
    kinds = {c.name: c.field_kind for c in columns if c.kind != "none"}
    return finish_scan(fields, samples, required, where, kinds)
