"""The rows of a packed output's tables checked once at open, before a reader uses any: shard
names, labels, record counts, every record inside its file and in shard order (in blocks: a few
MB of temporaries at any size). ``packer.read.store.open_packed`` runs it, local and URL alike.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from packer.core.manifest import Manifest
from packer.errors import FormatError
from packer.formats import by_name

__all__ = ["validate_tables"]


def _bad(path: Path | str, what: str, start: int, rows: np.ndarray) -> FormatError:
    first = start + int(np.flatnonzero(rows)[0])
    return FormatError(
        f"{str(path)!r} is damaged or crafted: {what} (row {first}); refusing to read it. "
        "Convert the source again"
    )


def validate_tables(
    path: Path | str, manifest: Manifest, index: np.ndarray, records: np.ndarray
) -> None:
    """Everything a reader will use, checked once at open: shard names are plain file names in
    the folder, labels lie in the class range, every record lies in its file, records lie in
    shard order (each shard's records one run of the table, of the shard's record count).

    Raises:
        FormatError: the first problem, naming the table row.
    """
    module = by_name(manifest.format)
    layout = manifest.opts.layout
    if layout not in module.LAYOUTS:
        raise FormatError(f"{str(path)!r}: layout {layout!r} is not one of {module.NAME}'s")
    plain = re.compile(r"shard-\d{5}" + re.escape(module.SHARD_SUFFIX))
    for shard in manifest.shards:
        if not plain.fullmatch(shard.name):
            raise FormatError(
                f"{str(path)!r}: shard name {shard.name!r} is not a plain shard file name in the "
                "dataset folder; refusing to read outside it"
            )
    held = np.zeros(len(manifest.shards), dtype=np.int64)
    for rows in _blocks(len(index)):
        _check_block(path, manifest, layout, module, index, records, rows, held)
    if layout == "shards" and not np.array_equal(
        held, np.array([s.samples for s in manifest.shards], dtype=np.int64)
    ):
        raise FormatError(
            f"{str(path)!r} is damaged or crafted: the record table and the shards' record "
            "counts disagree; refusing to read it. Convert the source again"
        )


BLOCK = 1 << 16  # samples checked at once: a few MB of temporaries, whatever the dataset's size


def _blocks(n: int) -> list[slice]:
    return [slice(a, min(a + BLOCK, n)) for a in range(0, n, BLOCK)]


def _check_block(
    path: Path | str,
    manifest: Manifest,
    layout: str,
    module: Any,
    index: np.ndarray,
    records: np.ndarray,
    rows: slice,
    held: np.ndarray,
) -> None:
    """Check samples ``rows`` and their records (the runs tile the table: ``load_records``);
    add their records to ``held``, the records of each shard."""
    labels = index["label"][rows]
    if manifest.kind == "fields":  # samples with fields have no class index
        outside_classes = labels != -1
    else:
        outside_classes = (labels < 0) | (labels >= len(manifest.classes))
    if outside_classes.any():
        what = f"a label outside the {len(manifest.classes)} classes"
        raise _bad(path, what, rows.start, outside_classes)
    counts = index["count"][rows].astype(np.int64)
    if manifest.kind == "fields":  # one record per field, an absent one empty: never more, fewer
        fields = len(manifest.opts.fields)
        if (wrong := counts != fields).any():
            raise _bad(
                path, f"a sample of other than {fields} records, one per field", rows.start, wrong
            )
    start = int(index["first"][rows.start])
    span = slice(start, start + int(counts.sum()))
    block = records[span]
    file, offset = block["file"].astype(np.int64), block["offset"]
    length = block["length"].astype(np.int64)
    if layout == "shards":
        bad_file = (file < 0) | (file >= len(manifest.shards))
    else:
        bad_file = file != np.repeat(np.arange(rows.start, rows.stop), counts)
    if bad_file.any():
        raise _bad(path, "a record names a file that is not the dataset's", start, bad_file)
    if layout == "shards":
        held += np.bincount(file, minlength=len(held))[: len(held)]
        _check_shard_order(path, records, start, file)
    if module.OFFSETS == "bytes" and layout == "shards":
        sizes = np.array([s.bytes for s in manifest.shards], dtype=np.int64)
        unknown = (offset == -1) if module.NAME == "lmdb" else np.zeros(len(offset), bool)
        # offset > size - length, never offset + length > size: the sum wraps for a crafted
        # offset near 2**63, the difference cannot (0 <= size < 2**63, 0 <= length < 2**32)
        outside = ((offset < 0) & ~unknown) | (offset > sizes[file] - length)
    elif module.OFFSETS == "numbers":
        outside = (offset < 0) | (offset >= np.repeat(counts, counts))
    else:
        outside = offset < 0
    if outside.any():
        raise _bad(path, "a record lies outside its file", start, outside)


def _check_shard_order(path: Path | str, records: np.ndarray, start: int, file: np.ndarray) -> None:
    """Records ``start ...`` (their shards ``file``) lie in shard order, as a conversion writes
    them: each shard's records are one run of the table, which LMDB's keys (a record's number
    in its shard) rely on."""
    backwards = file[1:] < file[:-1]  # backwards[k]: record start + 1 + k
    first = start + 1
    if start > 0 and len(file) and int(records["file"][start - 1]) > file[0]:
        backwards, first = np.concatenate(([True], backwards)), start
    if backwards.any():
        what = "a record lies in an earlier shard than the record before it"
        raise _bad(path, what, first, backwards)
