"""A table of samples as a source: CSV, TSV, JSONL or Parquet, a row per sample.

One column holds image paths, relative to the table's folder (``--image-column``; found by
name when not given: ``image``, ``image_path``, ``path``, ``file``, ``filename``,
``file_name``, ``jpg``, ``png``); every other column is a field of the same name. A column's
kind follows from its name as a key-grouped file's does (``caption`` and ``txt`` are text,
``label`` and ``cls`` integers, ``json`` JSON); other columns take their values' kind: text in
a CSV; in JSONL and Parquet integers, text, or JSON for anything else (floats, lists, objects).
A row's key is its ``key`` column when there is one, else its row number (``000000000``).

Skipped, each with its reason: a row whose image path is empty, absolute, climbs out of the
table's folder, holds a NUL or names no file; a CSV row with fewer or more cells than the
header; a JSONL line that does not parse (or nests too deep); a cell that is not UTF-8 (a lone
surrogate); a value its column's kind refuses (checked when the sample is loaded). An empty cell
(CSV), a ``null`` or a missing key (JSONL, Parquet) is an absent field. Parquet dates, times and
timestamps are stored as ISO text, decimals as decimal strings. Refused in one line: a table
that cannot be read, a CSV column named twice, a column name that is not a plain field name, an
image column that is missing or (Parquet) does not hold strings.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packer.core.fields import MAX_FIELDS, field_kind
from packer.errors import SourceError
from packer.source.images import SkippedInput
from packer.source.json_bounded import (
    dumps_utf8,
    inside_path,
    loads_bounded,
    plain_text,
    text_value,
)
from packer.source.samples import (
    FieldSample,
    FieldScan,
    Part,
    declare_fields,
    finish_scan,
    why_none,
)

__all__ = ["TABLE_SUFFIXES", "looks_table", "scan_table"]

TABLE_SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")
IMAGE_COLUMNS = ("image", "image_path", "path", "file", "filename", "file_name", "jpg", "png")
Row = dict[str, Any]


def looks_table(src: str | os.PathLike[str]) -> bool:
    """Whether ``src`` is a file named as a table of samples."""
    return os.fspath(src).lower().endswith(TABLE_SUFFIXES) and os.path.isfile(src)


def _csv_rows(path: Path, delimiter: str) -> tuple[list[str], Iterator[tuple[int, Row | str]]]:
    handle = open(path, newline="", encoding="utf-8-sig")  # noqa: SIM115 (closed by the rows)
    reader = csv.DictReader(handle, delimiter=delimiter)
    try:
        columns = list(reader.fieldnames or [])
    except (UnicodeDecodeError, csv.Error) as exc:
        handle.close()
        raise SourceError(f"{str(path)!r} cannot be read as CSV: {exc}") from exc
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        handle.close()
        raise SourceError(
            f"{str(path)!r}: column {twice[0]!r} is named twice in the header (one would hide "
            "the other); name each column once"
        )

    def rows() -> Iterator[tuple[int, Row | str]]:
        with handle:
            try:
                for n, row in enumerate(reader):
                    yield n, _csv_row(row, len(columns))
            except (UnicodeDecodeError, csv.Error) as exc:
                raise SourceError(
                    f"{str(path)!r} line {reader.line_num}: cannot be read as CSV: {exc}"
                ) from exc

    return columns, rows()


def _csv_row(row: dict[Any, Any], width: int) -> Row | str:
    """A CSV row's non-empty cells, or why the row cannot be used (its cells do not match the
    header's columns: a missing cell would be read as no value, an extra one lost)."""
    if None in row:
        return f"{width + len(row[None])} cells, the header names {width} columns"
    if any(v is None for v in row.values()):
        have = sum(v is not None for v in row.values())
        return f"{have} cells, the header names {width} columns"
    return {k: v for k, v in row.items() if v != ""}


def _jsonl_rows(path: Path, skipped: list[SkippedInput]) -> tuple[list[str], list[tuple[int, Row]]]:
    rows: list[tuple[int, Row]] = []
    columns: dict[str, None] = {}
    try:
        with open(path, "rb") as handle:
            for n, line in enumerate(handle):
                if not line.strip():
                    continue
                try:
                    row = loads_bounded(line)
                except ValueError as exc:
                    skipped.append(SkippedInput(f"{path}:{n + 1}", f"not a JSON line: {exc}"))
                    continue
                if not isinstance(row, dict):
                    skipped.append(SkippedInput(f"{path}:{n + 1}", "not a JSON object"))
                    continue
                columns.update(dict.fromkeys(row))
                rows.append((n, {k: v for k, v in row.items() if v is not None}))
    except OSError as exc:
        raise SourceError(f"{str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    return list(columns), rows


def _parquet_rows(path: Path, image_column: str | None) -> tuple[list[str], list[tuple[int, Row]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise SourceError(
            "reading a Parquet table needs pyarrow: pip install 'packer-datasets[table]'"
        ) from exc
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises its own ArrowInvalid / OSError family
        raise SourceError(f"{str(path)!r} cannot be read as Parquet: {exc}") from exc
    columns = list(table.column_names)
    column = image_column or next((c for c in IMAGE_COLUMNS if c in columns), None)
    if column in columns:
        import pyarrow as pa

        dtype = table.schema.field(column).type
        if not (pa.types.is_string(dtype) or pa.types.is_large_string(dtype)):
            raise SourceError(
                f"{str(path)!r}: image column {column!r} holds {dtype}, not paths (strings)"
            )
    rows = [
        (n, {k: text_value(v) for k, v in row.items() if v is not None})
        for n, row in enumerate(table.to_pylist())
    ]
    return columns, rows


def _image_column(columns: list[str], given: str | None, where: str) -> str:
    if given is not None:
        if given not in columns:
            raise SourceError(
                f"{where} has no column {given!r} (--image-column); its columns are "
                f"{', '.join(map(repr, columns)) or '(none)'}"
            )
        return given
    for name in IMAGE_COLUMNS:
        if name in columns:
            return name
    raise SourceError(
        f"{where} has no image column ({', '.join(IMAGE_COLUMNS)}); name it with --image-column "
        f"(its columns are {', '.join(map(repr, columns)) or '(none)'})"
    )


def _value_kind(values: list[Any], csv_table: bool) -> str:
    """The kind of a column named like no kind, from its values."""
    if csv_table:
        return "text"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if all(isinstance(v, str) for v in values):
        return "text"
    if all(isinstance(v, bytes) for v in values):
        return "bytes"
    return "json"


def _encode(value: Any, kind: str, text_is_raw: bool) -> bytes:
    """A cell's value as the bytes its field stores (checked by kind when loaded); a string is
    stored as it is when ``text_is_raw`` (a CSV cell, a string in a column named ``json``)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str) and text_is_raw:
        return plain_text(value, "its text", nul=True)
    if kind == "json" or not isinstance(value, (str, int)) or isinstance(value, bool):
        return dumps_utf8(value, "its value")
    return plain_text(str(value), "its text", nul=True)


def _image_part(table_dir: str, field: str, value: Any) -> tuple[Part | None, str]:
    """The image column's part of a row, or why the row cannot be used."""
    if not isinstance(value, str) or not value.strip():
        return None, "no image path"
    try:
        inside_path(value, "its image path", "image path {!r} is outside the table's folder")
    except ValueError as exc:
        return None, str(exc)
    path = os.path.join(table_dir, value)
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return None, f"image {value!r}: {exc.strerror}"
    if not os.path.isfile(path):
        return None, f"image {value!r} is not a file"
    return Part(field, path, size), ""


def _row_sample(
    row: Row | str,
    at: str,
    key: str,
    table: Path,
    columns: tuple[str, str | None, list[str]],
    kinds: dict[str, str],
    raw: dict[str, bool],
) -> FieldSample | str:
    """The sample of one row, or why the row is skipped (the whole row: one unusable cell).
    ``columns``: the image column, the key column, every field column."""
    if isinstance(row, str):
        return row
    image, key_column, names = columns
    part, why = _image_part(str(table.parent), image, row.get(image))
    if part is None:
        return why
    if key_column and key_column in row:
        key = str(row[key_column])
        try:
            plain_text(key, "its key")
        except ValueError as exc:
            return str(exc)
    parts = [part]
    for name in names:
        if name != image and name in row:
            try:
                data = _encode(row[name], kinds[name], raw[name])
            except ValueError as exc:
                return f"column {name!r}: {exc}"
            parts.append(Part(name, str(table), len(data), data=data))
    size = sum(p.size for p in parts)
    return FieldSample(key, at, size, tuple(sorted(parts, key=lambda p: p.field)))


def scan_table(
    src: str | os.PathLike[str],
    image_column: str | None = None,
    required: list[str] | None = None,
) -> FieldScan:
    """Scan a table of samples into an ordered :class:`FieldScan` (the images only stat-ed).

    Raises:
        SourceError: the table cannot be read, has no image column, or a column whose name is
            not a plain field name; no usable row; a ``required`` field no sample has.
    """
    path = Path(src)
    where = repr(str(path))
    if not path.is_file():
        raise SourceError(f"table {where} does not exist or is not a file")
    scan = FieldScan(root=str(path.parent.resolve()), kind="fields", classes=[], samples=[])
    scan.source_kind = "table"
    suffix = path.suffix.lower()
    rows: Any
    if suffix in (".csv", ".tsv"):
        columns, rows = _csv_rows(path, "\t" if suffix == ".tsv" else ",")
    elif suffix == ".jsonl":
        columns, rows = _jsonl_rows(path, scan.skipped)
    else:
        columns, rows = _parquet_rows(path, image_column)
    image = _image_column(columns, image_column, where)
    if len(columns) > MAX_FIELDS + 1:
        declare_fields(set(columns), where)  # raises: more than MAX_FIELDS
    key_column = "key" if "key" in columns and image != "key" else None
    names = [c for c in columns if c != key_column]
    declare_fields(set(names), where)  # every column a plain name, or refused here
    rows = list(rows)
    kinds = {image: "image"}
    raw = {image: True}
    for name in names:
        if name != image:
            kinds[name] = field_kind(name)
            raw[name] = suffix in (".csv", ".tsv") or kinds[name] != "bytes"
            if kinds[name] == "bytes":
                found = [r[name] for _, r in rows if isinstance(r, dict) and name in r]
                kinds[name] = _value_kind(found, suffix in (".csv", ".tsv"))
    samples = []
    for n, row in rows:
        at = f"{path}:{n + 2 if suffix in ('.csv', '.tsv') else n + 1}"
        got = _row_sample(row, at, f"{n:09d}", path, (image, key_column, names), kinds, raw)
        if isinstance(got, str):
            scan.skipped.append(SkippedInput(at, got))
        else:
            samples.append(got)
    if not samples:
        raise SourceError(
            f"{where} holds no usable row (an image path relative to the table): "
            f"{why_none(scan.skipped)}"
        )
    return finish_scan(scan, samples, required, where, kinds)
