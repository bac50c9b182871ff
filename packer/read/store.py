"""Open a packed output for reading: manifest, sample table, record table, the format's reader.

Shared by image and clip datasets and by ``verify``: nothing here opens a data file (readers
open theirs lazily, per process).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from packer.core.contained import check_relative, open_beneath, open_folder
from packer.core.fields import kind_noun
from packer.core.keytable import KeyTable
from packer.core.manifest import (
    KEYS_NAME,
    MANIFEST_NAME,
    Manifest,
    load_index,
    load_manifest,
    load_records,
)
from packer.core.tablefile import read_checked
from packer.errors import FormatError
from packer.formats import by_name
from packer.formats.base import ReaderBase, shard_identities
from packer.read.options import check_keywords, keywords_of
from packer.remote.local import is_file_url, staged_root
from packer.remote.opener import CacheOptions, RemoteOutput, open_remote
from packer.remote.storage import is_url

__all__ = ["Packed", "open_packed", "split_root", "validate_tables"]


@dataclass
class Packed:
    """A packed output, ready to read: its manifest, sample table columns and reader.

    The columns are views of the memory-mapped tables (``manifest.load_index``): no copy, and
    their pages are shared by every process that opens or inherits the dataset."""

    root: Path  # a URL (str) for a remote dataset
    manifest: Manifest
    labels: np.ndarray
    counts: np.ndarray
    first: np.ndarray
    reader: ReaderBase
    checksums: np.ndarray  # xxh3_64 of every record (verify compares against it)


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
    layout = manifest.options.get("layout", "shards")
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
        fields = len(manifest.options.get("fields") or ())
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


def _folder_id(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _same_folder(path: Path, fd: int) -> None:
    """``path`` still names the folder ``fd`` holds (the manifest was read by path)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FormatError(f"cannot open {str(path)!r}: {exc.strerror or exc}") from exc
    if (st.st_dev, st.st_ino) != _folder_id(fd):
        raise FormatError(f"{str(path)!r} was replaced while it was being opened; try again")


def _plain_manifest(path: Path, fd: int) -> None:
    """The manifest, if there, is a regular file of this folder: not a link to another
    dataset's, not a FIFO (a missing one is ``load_manifest``'s to explain)."""
    try:
        st = os.stat(MANIFEST_NAME, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise FormatError(
            f"{str(path / MANIFEST_NAME)!r} is {kind}; refusing to read it (a dataset holds "
            "only plain folders and files). Convert again"
        )


def _keys(path: Path, manifest: Manifest, fd: int) -> KeyTable:
    """``keys.txt``, mapped once through the folder's descriptor and checked against the
    manifest: the keys of this open dataset, whatever replaces the file later."""
    data, ident = read_checked(path, KEYS_NAME, manifest.digest(KEYS_NAME, str(path)), True, fd)
    plain = manifest.options.get("layout", "shards") == "per-sample"
    pinned = (_folder_id(fd), ident)
    return KeyTable.loaded(path / KEYS_NAME, data, manifest.num_samples, plain, pinned)


def open_packed(
    root: str | os.PathLike[str],
    kind: str | None = None,
    format: str | None = None,
    check_files: bool = True,
    split: str | None = None,
    **reader_options: Any,
) -> Packed:
    """Load the manifest and tables of the packed output at ``root`` and make its reader.

    One snapshot: the folder is opened once and every table, ``keys.txt`` and shard identity
    comes through that descriptor, each table checked against the manifest's xxh3; readers in
    any process then refuse a folder, shard or keys file replaced since.

    ``root`` may be a URL (``s3://bucket/out.npy``, any fsspec protocol): manifest and tables
    are fetched whole and checked the same way, data files are read by byte ranges or through
    the node's shard cache (LMDB; see :func:`packer.remote.opener.open_remote`).

    Args:
        kind: refuse an output of another kind (``"image"`` or ``"video"``).
        format: refuse an output of another format (the dataset classes pin one).
        check_files: refuse shards that are missing or of the wrong size (``verify`` reports
            them instead).
        split: the split to open, for an output holding splits (``packer.write.splits``).
        reader_options: passed to the format's reader (``readahead``, ``max_open_files``);
            ``storage_options`` (a dict) goes to fsspec when ``root`` is a URL, and
            ``cache``, ``cache_dir``, ``cache_limit`` choose its shard cache
            (``packer.remote.opener.CacheOptions``).

    Raises:
        FormatError: not a complete packer output, another kind or format, or damaged tables.
    """
    storage_options = reader_options.pop("storage_options", None)
    cache = CacheOptions.pop(reader_options)
    # file:// is its path; a local dataset with a cache option is staged (packer.remote.local)
    root = staged_root(root, storage_options is None and cache.given() and cache.cache is not False)
    if is_url(root) or is_file_url(root):
        got = open_remote(
            str(root), kind, format, check_files, split, storage_options, cache, reader_options
        )
        return _remote_packed(got)
    if storage_options is not None:
        raise FormatError(f"storage_options is for a URL; {str(root)!r} is a local path")
    path = split_root(Path(root), split)
    fd = open_folder(path)
    try:
        return _open_in(path, fd, kind, format, check_files, reader_options)
    finally:
        os.close(fd)


def _open_in(
    path: Path,
    fd: int,
    kind: str | None,
    format: str | None,
    check_files: bool,
    reader_options: dict[str, Any],
) -> Packed:
    _plain_manifest(path, fd)
    manifest = load_manifest(path)
    _same_folder(path, fd)
    if format and manifest.format != format:
        raise FormatError(
            f"{str(path)!r} holds format {manifest.format!r}, not {format!r}; "
            "use packer.open_dataset() to pick the right class"
        )
    if kind and manifest.kind != kind:
        raise FormatError(f"{str(path)!r} holds {kind_noun(manifest.kind)}, not {kind_noun(kind)}")
    index = load_index(path, manifest, mmap=True, dir_fd=fd)
    records = load_records(path, index, mmap=True, manifest=manifest, dir_fd=fd)
    validate_tables(path, manifest, index, records)
    keys = _keys(path, manifest, fd)
    Reader = by_name(manifest.format).Reader
    takes = keywords_of(Reader.__init__)[3:]  # after root, manifest, records
    check_keywords(reader_options, takes, f"a {manifest.format.upper()} dataset's reader")
    reader = Reader(path, manifest, records, **reader_options)
    shards = shard_identities(path, manifest, fd) if check_files else None
    reader.pin(_folder_id(fd), shards, keys)
    return Packed(
        path,
        manifest,
        index["label"],
        index["count"],
        index["first"],
        reader,
        records["checksum"],
    )


def _remote_packed(got: RemoteOutput) -> Packed:
    """``open_packed`` of a URL: tables fetched and checked (``store_remote``), then checked
    row by row as a local output's are."""
    validate_tables(got.url, got.manifest, got.samples, got.records)
    index = got.samples
    return Packed(
        cast(Path, got.url),  # a URL: it names the dataset in messages, it is never opened
        got.manifest,
        index["label"],
        index["count"],
        index["first"],
        got.reader,
        got.records["checksum"],
    )


def split_root(root: Path, split: str | None) -> Path:
    """The folder of ``split`` in the packed output ``root`` (``root`` itself if it has no
    splits and none is asked).

    Raises:
        FormatError: a split output opened without ``split``, an unknown split, or ``split``
            asked of an output without splits.
    """
    manifest = load_manifest(root)
    names = list(manifest.options.get("splits", {})) if manifest.kind == "splits" else []
    if not names:
        if split is not None:
            raise FormatError(f"{str(root)!r} has no splits; open it without split=")
        return root
    if split is None:
        raise FormatError(
            f"{str(root)!r} holds splits {', '.join(names)}: pass split= (e.g. split={names[0]!r})"
        )
    if split not in names:
        raise FormatError(f"{str(root)!r} has no split {split!r}; it has {', '.join(names)}")
    if "/" in check_relative(split, "split name"):
        raise FormatError(f"split name {split!r} of {str(root)!r} is not a plain folder name")
    folder = open_folder(root)
    try:  # a real folder inside the output, never a link to another dataset
        os.close(open_beneath(folder, split, root, folder=True, what="split"))
    finally:
        os.close(folder)
    return root / split
