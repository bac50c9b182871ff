"""Open a packed output for reading: manifest, sample table, record table, the format's reader.

Shared by image and clip datasets and by ``verify``: nothing here opens a data file (readers
open theirs lazily, per process).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
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
    parse_manifest,
)
from packer.core.manifest_schema import check_manifest_size
from packer.core.tablefile import read_checked
from packer.errors import FormatError, PackerError
from packer.formats import by_name
from packer.formats.base import ReaderBase, shard_identities
from packer.formats.record_check import CheckedReader, LocalCheck
from packer.read.options import ReadOptions, check_keywords, keywords_of
from packer.read.rows import validate_tables
from packer.remote.local import is_file_url, staged_root
from packer.remote.opener import CacheOptions, RemoteOutput, open_remote
from packer.remote.storage import is_url

__all__ = [
    "ManifestCheck",
    "Packed",
    "check_packed",
    "open_packed",
    "opened",
    "split_root",
    "validate_tables",
]


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
    given: str | os.PathLike[str] = ""  # the root as the caller named it (a split's parent)
    options: ReadOptions = field(default_factory=ReadOptions)  # how it was opened


ManifestCheck = Callable[[Manifest, str], None]  # a caller's check of the manifest, at once


def check_packed(packed: Packed, kind: str | None, format: str | None) -> Packed:
    """``packed`` (handed to a dataset class by ``open_dataset``), of ``kind`` and ``format``.

    Raises:
        FormatError: another kind or format, as ``open_packed`` refuses them.
    """
    _check_kind(str(packed.root), packed.manifest, kind, format)
    return packed


def opened(
    root: str | os.PathLike[str] | Packed, kind: str, format: str | None, options: ReadOptions
) -> Packed:
    """What a dataset class reads: ``root`` opened with ``options``, or, handed an open output
    (``open_dataset``'s), that output checked for ``kind`` and ``format``.

    Raises:
        PackerError: read options given beside an open output; what ``open_packed`` raises.
    """
    if not isinstance(root, Packed):
        return open_packed(root, kind, format, options=options)
    if options.given():
        raise PackerError(
            f"{', '.join(options.given())}: the read options of an open output are the ones it "
            "was opened with (open_packed's)"
        )
    return check_packed(root, kind, format)


def _check_kind(where: str, manifest: Manifest, kind: str | None, format: str | None) -> None:
    if format and manifest.format != format:
        raise FormatError(
            f"{where!r} holds format {manifest.format!r}, not {format!r}; "
            "use packer.open_dataset() to pick the right class"
        )
    if kind and manifest.kind != kind:
        raise FormatError(f"{where!r} holds {kind_noun(manifest.kind)}, not {kind_noun(kind)}")


def _folder_id(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _read_manifest(path: Path, fd: int) -> Manifest:
    """``packer.json`` of the folder ``fd`` (``path``), read through that descriptor: one open
    of the file, a regular file of this folder (not a link to another dataset's, not a FIFO).

    Raises:
        FormatError: missing (not a complete output), not a regular file, unreadable, or not
            a valid manifest.
    """
    try:
        st = os.stat(MANIFEST_NAME, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return load_manifest(path)  # says why: no manifest, an interrupted conversion, ...
    if not stat.S_ISREG(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise FormatError(
            f"{str(path / MANIFEST_NAME)!r} is {kind}; refusing to read it (a dataset holds "
            "only plain folders and files). Convert again"
        )
    file = open_beneath(fd, MANIFEST_NAME, path)
    try:
        check_manifest_size(str(path / MANIFEST_NAME), os.fstat(file).st_size)
        with os.fdopen(file, "rb", closefd=False) as fh:
            raw = fh.read()
    except OSError as exc:
        raise FormatError(f"cannot read {str(path / MANIFEST_NAME)!r}: {exc}") from exc
    finally:
        os.close(file)
    return parse_manifest(raw, str(path / MANIFEST_NAME), str(path))


def _located(root: Path, split: str | None) -> tuple[Path, int, Manifest]:
    """The folder of ``split`` in the output ``root`` (``root`` itself if it has no splits and
    none is asked), a descriptor of it and its manifest: each ``packer.json`` read once."""
    fd = open_folder(root)
    try:
        manifest = _read_manifest(root, fd)
        name = _split_name(root, manifest, split)
        if name is None:
            return root, fd, manifest
        # a real folder inside the output, never a link to another dataset
        inner = open_beneath(fd, name, root, folder=True, what="split")
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    try:
        return root / name, inner, _read_manifest(root / name, inner)
    except BaseException:
        os.close(inner)
        raise


def _keys(path: Path, manifest: Manifest, fd: int) -> KeyTable:
    """``keys.txt``, mapped once through the folder's descriptor and checked against the
    manifest: the keys of this open dataset, whatever replaces the file later."""
    data, ident = read_checked(path, KEYS_NAME, manifest.digest(KEYS_NAME, str(path)), True, fd)
    plain = manifest.opts.layout == "per-sample"
    pinned = (_folder_id(fd), ident)
    return KeyTable.loaded(path / KEYS_NAME, data, manifest.num_samples, plain, pinned)


def open_packed(
    root: str | os.PathLike[str],
    kind: str | None = None,
    format: str | None = None,
    check_files: bool = True,
    split: str | None = None,
    options: ReadOptions | None = None,
    check: ManifestCheck | None = None,
    **reader_options: Any,
) -> Packed:
    """Load the manifest and tables of the packed output at ``root`` and make its reader.

    One snapshot: the folder is opened once and ``packer.json`` (read once), every table,
    ``keys.txt`` and shard identity come through that descriptor, each table checked against the manifest's xxh3; readers in
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
        options: the read options (:class:`~packer.read.options.ReadOptions`): ``readahead``
            and ``max_open_files`` go to the format's reader; ``storage_options`` (a dict) to
            fsspec when ``root`` is a URL; ``cache``, ``cache_dir``, ``cache_limit`` choose its
            shard cache (``packer.remote.opener.CacheOptions``); ``check_records`` checks
            every record a local output serves against its xxh3 (a URL's always are).
        check: called with the manifest (and the folder or URL it names) as soon as it is
            read, before any table: ``open_dataset``'s check of the kind it expects.
        reader_options: the read options by name instead of ``options`` (each checked by
            name: a typo is a PackerError naming the closest one).

    Raises:
        FormatError: not a complete packer output, another kind or format, or damaged tables.
    """
    read = ReadOptions.of(options, split, reader_options)
    cache = CacheOptions(read.cache, read.cache_dir, read.cache_limit)
    # file:// is its path; a local dataset with a cache option is staged (packer.remote.local)
    staged = staged_root(
        root, read.storage_options is None and cache.given() and cache.cache is not False
    )
    if is_url(staged) or is_file_url(staged):
        got = open_remote(
            str(staged),
            kind,
            format,
            check_files,
            read.split,
            read.storage_options,
            cache,
            read.for_reader(),
            check,
        )
        return _remote_packed(got, root, read)
    if read.storage_options is not None:
        raise FormatError(f"storage_options is for a URL; {str(root)!r} is a local path")
    path, fd, manifest = _located(Path(staged), read.split)
    try:
        if check is not None:
            check(manifest, str(path))
        return _open_in(path, fd, manifest, kind, format, check_files, read, root)
    finally:
        os.close(fd)


def _open_in(
    path: Path,
    fd: int,
    manifest: Manifest,
    kind: str | None,
    format: str | None,
    check_files: bool,
    read: ReadOptions,
    given: str | os.PathLike[str],
) -> Packed:
    _check_kind(str(path), manifest, kind, format)
    index = load_index(path, manifest, mmap=True, dir_fd=fd)
    records = load_records(path, index, mmap=True, manifest=manifest, dir_fd=fd)
    validate_tables(path, manifest, index, records)
    keys = _keys(path, manifest, fd)
    Reader = by_name(manifest.format).Reader
    reader_options = read.for_reader()
    takes = keywords_of(Reader.__init__)[3:]  # after root, manifest, records
    check_keywords(reader_options, takes, f"a {manifest.format.upper()} dataset's reader")
    reader = Reader(path, manifest, records, **reader_options)
    shards = shard_identities(path, manifest, fd) if check_files else None
    reader.pin(_folder_id(fd), shards, keys)
    if read.check_records:  # every record served compared with its xxh3 (formats/record_check)
        check = LocalCheck(reader, records, index["first"], manifest.format)
        reader = cast(ReaderBase, CheckedReader(reader, check))  # the reader's API, checked
    return Packed(
        path,
        manifest,
        index["label"],
        index["count"],
        index["first"],
        reader,
        records["checksum"],
        given,
        read,
    )


def _remote_packed(got: RemoteOutput, given: str | os.PathLike[str], read: ReadOptions) -> Packed:
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
        given,
        read,
    )


def split_root(root: Path, split: str | None) -> Path:
    """The folder of ``split`` in the packed output ``root`` (``root`` itself if it has no
    splits and none is asked).

    Raises:
        FormatError: a split output opened without ``split``, an unknown split, or ``split``
            asked of an output without splits.
    """
    path, fd, _ = _located(root, split)
    os.close(fd)
    return path


def _split_name(root: Path, manifest: Manifest, split: str | None) -> str | None:
    """The folder name of ``split`` in the output ``root`` of ``manifest`` (None: the output
    holds no splits and none is asked).

    Raises:
        FormatError: as :func:`split_root`.
    """
    names = list(manifest.opts.splits) if manifest.kind == "splits" else []
    if not names:
        if split is not None:
            raise FormatError(f"{str(root)!r} has no splits; open it without split=")
        return None
    if split is None:
        raise FormatError(
            f"{str(root)!r} holds splits {', '.join(names)}: pass split= (e.g. split={names[0]!r})"
        )
    if split not in names:
        raise FormatError(f"{str(root)!r} has no split {split!r}; it has {', '.join(names)}")
    if "/" in check_relative(split, "split name"):
        raise FormatError(f"split name {split!r} of {str(root)!r} is not a plain folder name")
    return split
