"""Open a packed output at a URL for reading (the work of ``packer.read.store.open_packed`` for a URL): the
manifest, tables and keys fetched whole and checked against the manifest's xxh3 exactly as a
local open checks them, shard sizes checked by one listing, and a reader
(``packer.remote.reader``, ``remote_cached``): ranged GETs for NPY and HDF5 (their shards through the node's
shard cache when asked), whole-object GETs for BMP's record files, the shard cache for LMDB
(it needs a local file).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import numpy as np

from packer.core.contained import check_relative
from packer.core.fields import kind_noun
from packer.core.manifest import (
    INDEX_NAME,
    KEYS_NAME,
    MANIFEST_NAME,
    RECORD_DTYPE,
    RECORDS_NAME,
    SAMPLE_DTYPE,
    Manifest,
    check_runs,
    parse_manifest,
)
from packer.core.retry import retried
from packer.core.tablefile import check_digest, fd_checksum, parse_table
from packer.errors import FormatError, PackerError
from packer.formats import by_name
from packer.formats.base import ReaderBase
from packer.remote import storage
from packer.remote.cache import CorruptDownload, ShardCache
from packer.remote.cached_lmdb import CachedLMDBReader
from packer.remote.cached_reader import CachedShardReader
from packer.remote.reader import HeldKeys, RemoteReader
from packer.remote.storage import RemoteFolder

__all__ = [
    "CacheOptions",
    "Check",
    "RemoteOutput",
    "cache_check",
    "fetched_manifest",
    "open_remote",
    "remote_manifest",
    "url_manifest",
]


T = TypeVar("T")
Check = Callable[[str, str, "int | None"], "str | None"]  # verify's check of one object


class RemoteOutput(NamedTuple):
    """A remote output, its tables fetched and checked against the manifest (the rows are
    ``store.validate_tables``'s to check) and its reader."""

    url: str
    manifest: Manifest
    samples: np.ndarray  # index.npy
    records: np.ndarray
    reader: ReaderBase


def _recorded(folder: RemoteFolder, manifest: Manifest, names: tuple[str, ...]) -> list[str]:
    """The manifest's xxh3 of each table ``names`` (before any is fetched)."""
    return [manifest.digest(name, folder.url) for name in names]


def _remote_table(
    folder: RemoteFolder, manifest: Manifest, name: str, data: bytes | None = None
) -> bytes:
    """Table ``name`` of the output at ``folder`` (``data``: its bytes fetched already), fetched
    whole and checked against the manifest's xxh3."""
    digest = _recorded(folder, manifest, (name,))[0]

    def check(got: bytes) -> bytes:
        check_digest(got, digest, folder.url_of(name))
        return got

    return _refetched(folder, name, check, data)


def _refetched(
    folder: RemoteFolder, name: str, check: Callable[[bytes], T], data: Any = None, **more: Any
) -> T:
    """``check(bytes of name)`` (``data``: fetched already), the object fetched again as
    :data:`packer.remote.storage.RETRY` says while its bytes fail their check: a body cut or flipped
    on the way (nothing checks a plain HTTP body) is no damaged dataset until it repeats.

    Raises:
        FormatError: the check's own, when every fetch failed it.
    """

    def try_once(attempt: int) -> T:  # a failed fetch is the request's own error, at once
        got = data if attempt == 1 and data is not None else folder.read_whole(name, **more)
        try:
            return check(got)
        except FormatError as exc:
            raise _CheckFailed(exc) from exc

    def give_up(exc: Exception, attempts: int, _: float) -> FormatError:
        return FormatError(f"{exc} (the same in {attempts} fetches)")

    return retried(storage.RETRY, try_once, lambda exc: isinstance(exc, _CheckFailed), give_up)


class _CheckFailed(Exception):
    """A fetched manifest or table that failed its check (its text: the check's message)."""


def remote_manifest(
    url: str, split: str | None, storage_options: dict[str, Any] | None
) -> tuple[str, Manifest]:
    """The URL of the output at ``url`` (of its ``split``) and its manifest."""
    folder, manifest = _remote_manifest(RemoteFolder(url, storage_options), split)
    return folder.url, manifest


def _check_remote_shards(folder: RemoteFolder, manifest: Manifest, sizes: dict[str, int]) -> None:
    """Every shard the manifest names is an object of the recorded size (``sizes``: the
    folder's listing)."""
    for shard in manifest.shards:
        found = sizes.get(shard.name)
        if found != shard.bytes:
            what = "is missing" if found is None else f"has {found} bytes"
            raise FormatError(
                f"shard {folder.url_of(shard.name)!r} {what} but the manifest records "
                f"{shard.bytes} bytes: it is truncated, was replaced or was never uploaded; "
                "upload the whole output again"
            )


def _fetch_manifest(folder: RemoteFolder) -> Manifest:
    """``packer.json`` at ``folder``, by one GET (small: s3fs need not HEAD it for its size,
    which it asks to split a large object into parallel GETs)."""
    url = folder.url_of(MANIFEST_NAME)
    one = {"max_concurrency": 1} if url.startswith(("s3://", "s3a://")) else {}
    check = lambda data: parse_manifest(data, url, folder.url)  # noqa: E731
    try:
        return _refetched(folder, MANIFEST_NAME, check, **one)
    except storage.MissingObject as exc:
        if exc.denied:
            raise
        found = storage.failure(exc.__cause__ or exc)
        raise FormatError(
            f"{folder.url!r} holds no packer dataset now: {url!r} is not there ({found}). The "
            "URL or the endpoint (storage_options={'endpoint_url': ...}) is wrong, nothing was "
            "uploaded there yet, or an upload is replacing the "
            f"dataset right now (an upload with --overwrite deletes the old {MANIFEST_NAME} "
            "first and writes the new one last: open it again once it ends)"
        ) from exc


@contextmanager
def fetched_manifest(
    url: str, split: str | None, storage_options: dict[str, Any] | None
) -> Iterator[tuple[str, Manifest]]:
    """The URL of the output at ``url`` (of its ``split``) and its manifest, as
    :func:`remote_manifest`, for the block's use (an open inside it fetches its own: an open
    hands its manifest on in its ``Packed``, never through a module's state)."""
    yield remote_manifest(url, split, storage_options)


def _remote_manifest(folder: RemoteFolder, split: str | None) -> tuple[RemoteFolder, Manifest]:
    """The manifest at ``folder`` (of ``split``'s folder for an output holding splits)."""
    manifest = _fetch_manifest(folder)
    names = list(manifest.opts.splits) if manifest.kind == "splits" else []
    if not names and split is None:
        return folder, manifest
    if split not in names:
        raise FormatError(
            f"{folder.url!r} holds splits {', '.join(names) or '(none)'}; pass split= one of them"
            + (f", not {split!r}" if split is not None else "")
        )
    assert split is not None
    if "/" in check_relative(split, "split name"):
        raise FormatError(f"split name {split!r} of {folder.url!r} is not a plain folder name")
    inner = RemoteFolder(folder.url_of(split), folder.options)
    return _remote_manifest(inner, None)


def _remote_index(folder: RemoteFolder, manifest: Manifest, data: bytes) -> np.ndarray:
    url = folder.url_of(INDEX_NAME)
    raw = _remote_table(folder, manifest, INDEX_NAME, data)
    index = parse_table(raw, url, SAMPLE_DTYPE, "index")
    if len(index) != manifest.num_samples:
        raise FormatError(
            f"index {url!r} has {len(index)} rows but the manifest says "
            f"{manifest.num_samples} samples: the dataset is corrupt, convert again"
        )
    return index


def _remote_keys(folder: RemoteFolder, manifest: Manifest, data: bytes) -> HeldKeys:
    """``keys.txt`` (fetched) checked; in a per-sample layout every key must be a plain
    relative name (checked on first use, as for a local dataset)."""
    plain = manifest.opts.layout == "per-sample"
    data = _remote_table(folder, manifest, KEYS_NAME, data)
    keys = HeldKeys(Path(KEYS_NAME), manifest.num_samples, plain)
    keys._blob = np.frombuffer(data, np.uint8) if data else np.zeros(0, np.uint8)
    keys.path = Path(folder.url_of(KEYS_NAME))
    return keys


@dataclass(frozen=True)
class CacheOptions:
    """How a remote dataset uses the node's shard cache (``open_packed``'s ``cache=``,
    ``cache_dir=``, ``cache_limit=``): LMDB always does; NPY/HDF5 shards when any of them is
    given (``cache=False`` aside); BMP records and per-sample files never (each read is one GET
    of exactly the bytes asked already)."""

    cache: bool | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None

    @classmethod
    def pop(cls, options: dict[str, Any]) -> CacheOptions:
        """The cache's options taken out of a reader's ``options``."""
        names = ("cache", "cache_dir", "cache_limit")
        return cls(**{name: options.pop(name) for name in names if name in options})

    def given(self) -> bool:
        return any(v is not None for v in (self.cache, self.cache_dir, self.cache_limit))

    def given_as(self) -> dict[str, Any]:
        """The options given, as ``open_packed``'s keyword arguments."""
        names = ("cache", "cache_dir", "cache_limit")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def wanted(self, manifest: Manifest, where: str) -> ShardCache | None:
        """The cache the output at ``where`` is read through, or None (ranged GETs).

        Raises:
            PackerError: ``cache=False`` for LMDB, a bad limit, or one below the largest shard.
        """
        layout = manifest.opts.layout
        if manifest.format == "lmdb":
            if self.cache is False:
                raise FormatError(
                    f"{where!r} is an LMDB output: LMDB reads a local file, so its shards are "
                    "read through the shard cache; drop cache=False"
                )
        elif manifest.format == "bmp" or layout != "shards":
            return None  # whole-record objects, or per-sample files read by ranges
        elif not self.cache and (self.cache is False or not self.given()):
            return None
        cache = ShardCache(self.cache_dir, self.cache_limit)
        if manifest.shards:
            largest = max(manifest.shards, key=lambda shard: shard.bytes)
            cache.check_fits(largest.bytes, f"the largest shard of {where!r}, {largest.name}")
        return cache


def open_remote(
    url: str,
    kind: str | None,
    format: str | None,
    check_files: bool,
    split: str | None,
    storage_options: dict[str, Any] | None,
    cache: CacheOptions | None = None,
    reader_options: dict[str, Any] | None = None,
    check: Callable[[Manifest, str], None] | None = None,
) -> RemoteOutput:
    """``open_packed``'s work for a URL: manifest, tables and keys fetched whole and checked
    against the manifest's xxh3, shard sizes checked by one listing, a reader by ranged GETs or
    through the shard cache (``cache``). ``check`` is called with the manifest (and the
    output's URL) as soon as it is fetched.

    Raises:
        FormatError: anything open_packed refuses.
        PackerError: the cache's limit is below the largest shard.
    """
    folder, manifest = _remote_manifest(RemoteFolder(url, storage_options), split)
    where = folder.url
    if check is not None:  # the caller's, before any table is fetched
        check(manifest, where)
    if format and manifest.format != format:
        raise FormatError(f"{where!r} holds format {manifest.format!r}, not {format!r}")
    if kind and manifest.kind != kind:
        raise FormatError(f"{where!r} holds {kind_noun(manifest.kind)}, not {kind_noun(kind)}")
    module = by_name(manifest.format)
    shard_cache = (cache or CacheOptions()).wanted(manifest, where)
    tables = [INDEX_NAME, RECORDS_NAME, KEYS_NAME]
    _recorded(folder, manifest, tuple(tables))
    shards = manifest.opts.layout == "shards"
    # the listing first: s3fs then knows each table's size from it, and asks no HEAD before
    # each table's GET; it checks the shards, and gives the ETags the cache keys hold
    listed = shards and (check_files or shard_cache is not None)
    sizes = folder.sizes([s.name for s in manifest.shards]) if listed else {}
    fetched = folder.read_wholes(tables)  # in flight together
    index = _remote_index(folder, manifest, fetched[0])
    raw = _remote_table(folder, manifest, RECORDS_NAME, fetched[1])
    records = parse_table(raw, folder.url_of(RECORDS_NAME), RECORD_DTYPE, "record table")
    check_runs(folder.url_of(RECORDS_NAME), index, records)
    keys = _remote_keys(folder, manifest, fetched[2])
    if check_files and shards:
        _check_remote_shards(folder, manifest, sizes)
    options = dict(reader_options or {})
    reader: ReaderBase
    if shard_cache is None:
        reader = RemoteReader(
            folder, manifest, records, getattr(module.Reader, "SAMPLE_SUFFIX", "")
        )
    elif manifest.format == "lmdb":
        reader = CachedLMDBReader(folder, shard_cache, manifest, records, **options)
    else:
        reader = CachedShardReader(folder, shard_cache, manifest, records, **options)
    reader.pin((0, 0), None, keys)
    return RemoteOutput(where, manifest, index, records, reader)


def url_manifest(url: str, storage_options: dict[str, Any] | None) -> Manifest:
    """The manifest at ``url`` as it is (an output holding splits: its top manifest)."""
    return _fetch_manifest(RemoteFolder(url, storage_options))


def cache_check(
    folder: RemoteFolder, cache: ShardCache, manifest: Manifest, stream: Check, differs: str
) -> Check:
    """A ``check(name, xxh3, size)`` for ``verify`` of a URL through the shard cache: a shard's
    size from one listing, its bytes downloaded into ``cache`` (checked there: the dataset is
    then warm), or its cached copy hashed whole (one that differs, damaged on the disk, is
    downloaded again and replaced); a table (size None) by ``stream``. ``differs``: the
    finding for bytes that do not match the manifest's xxh3."""
    listed = folder.sizes([s.name for s in manifest.shards])

    def check(name: str, digest: str, size: int | None) -> str | None:
        if size is None:
            return stream(name, digest, size)
        found = listed.get(name)
        if found is None:
            return f"cannot be read: missing from the listing of {folder.url!r}"
        if found != size:
            return f"{found} bytes, manifest records {size}"
        try:
            entry = cache.open(folder, name, size, digest)
            try:  # a copy cached before is hashed whole too: a damaged one is replaced
                fd = entry.open_data()
                try:
                    hashed = fd_checksum(fd)
                finally:
                    os.close(fd)
                if hashed != digest:
                    cache.open(folder, name, size, digest, bad=entry.identity).close()
            finally:
                entry.close()
        except CorruptDownload:
            return differs
        except PackerError as exc:
            return f"cannot be read: {exc}"
        return None

    return check
