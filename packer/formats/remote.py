"""Readers of outputs at a URL.

:class:`RemoteReader` reads records as byte ranges of objects (NPY and HDF5 shards and
per-sample files): a request's records are grouped by file and sorted by offset, nearby ones
coalesced into one ranged GET (``packer.storage.GAP``), and every run of the request is in
flight at once (fsspec's ``cat_ranges``). BMP records are whole objects (one file each), each
fetched by one GET and checked against the record table's xxh3 before it is served.

:class:`CachedLMDBReader` and :class:`CachedShardReader` read whole shards downloaded into the
node's shard cache (``packer.cache``): LMDB needs a local file, so a shard is downloaded before
its first read; NPY/HDF5 shards are cached when asked (warm epochs then read at local speed),
and a record whose shard is not cached yet is served by a checked ranged GET while the shard
downloads in the background. A cached shard is held (never evicted) while its handle is open.

All are picklable: the URL, the options, the tables and the cache's folder and limit; each
process opens its own client (``packer.storage.RemoteFolder``) and its own cache entries.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from packer import storage
from packer.cache import CacheEntry, ShardCache
from packer.errors import FormatError
from packer.formats import lmdb
from packer.formats.base import ReaderBase
from packer.formats.bmp import record_name
from packer.formats.files import Folder, MappedFile
from packer.formats.lmdb_env import Handle
from packer.keytable import KeyTable
from packer.manifest import Manifest, bytes_checksum
from packer.storage import GAP, RemoteFolder, coalesce

__all__ = ["CachedLMDBReader", "CachedShardReader", "HeldKeys", "RemoteReader"]


class HeldKeys(KeyTable):
    """Keys read from a URL at open: they pickle with their bytes (no file to map again)."""

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["blob"] = self._load()[0].tobytes()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        blob = state["blob"]
        self._blob = np.frombuffer(blob, np.uint8) if blob else np.zeros(0, np.uint8)


class RemoteReader(ReaderBase):
    """Read records of an NPY, HDF5 or BMP output at a URL by ranged GETs.

    Args:
        folder: the output's folder (URL and storage options).
        manifest, records: the output's manifest and record table (fetched and checked).
        sample_suffix: the format's per-sample file suffix (``.npy``, ``.h5``).
    """

    def __init__(
        self,
        folder: RemoteFolder,
        manifest: Manifest,
        records: np.ndarray,
        sample_suffix: str,
        gap: int = GAP,
        verify: bool = False,
        max_open_files: int | None = None,
    ) -> None:
        super().__init__(folder.url, manifest, records, max_open_files)
        self.url = folder.url
        self.remote = folder
        self.sample_suffix = sample_suffix
        self.gap = gap
        # BMP: a record is a whole file, checked against its xxh3 (the object has no other
        # check); with ``verify`` every record fetched is (a cached reader's ranged reads)
        self.whole_files = manifest.format == "bmp"
        checked = self.whole_files or verify
        self.checksum: np.ndarray | None = records["checksum"] if checked else None

    def file_name(self, file: int) -> str:
        """The name of data file ``file`` in the folder (a shard, or a sample's file)."""
        if self.layout == "per-sample":
            return self.keys[file] + self.sample_suffix
        return self.shard_names[file]

    def _runs(self, rec: np.ndarray) -> tuple[list[str], list[int], list[int], list[Any]]:
        """The objects, ranges and pieces (where each record of a range goes) to fetch."""
        names: list[str] = []
        starts: list[int] = []
        stops: list[int] = []
        pieces: list[tuple[int, list[int], list[int], list[int]]] = []
        for file, where in self._groups(rec):
            chosen = rec[where]
            offsets = self.offset[chosen].tolist()
            lengths = self.length[chosen].tolist()
            if self.whole_files:  # BMP: record k is file record_name(key, kind, k)
                key = self.keys[file]
                for j, number, n in zip(where.tolist(), offsets, lengths):
                    names.append(record_name(key, self.kind, number))
                    starts.append(0)
                    stops.append(n)
                    pieces.append((0, [j], [0], [n]))
                continue
            name = self.file_name(file)
            for start, stop, first, last in coalesce(offsets, lengths, self.gap):
                names.append(name)
                starts.append(start)
                stops.append(stop)
                positions = where[first:last].tolist()
                pieces.append((start, positions, offsets[first:last], lengths[first:last]))
        return names, starts, stops, pieces

    def read_many(self, records: Sequence[int] | np.ndarray) -> list[bytes]:
        """The stored bytes of each record, in the order asked: one request per coalesced run,
        all runs of the call in flight together (each record checked against its xxh3 when
        the reader checks them)."""
        rec = np.asarray(records, dtype=np.int64)
        out = self._fetch(rec)
        if self.checksum is not None:
            self._check_records(rec, out)
        return out

    def _fetch(self, rec: np.ndarray) -> list[bytes]:
        out: list[bytes] = [b""] * len(rec)
        names, starts, stops, pieces = self._runs(rec)
        if not names:
            return out
        blocks = self.remote.read_runs(names, starts, stops)
        for block, (start, positions, offsets, lengths) in zip(blocks, pieces):
            view = memoryview(block)
            for j, a, n in zip(positions, offsets, lengths):
                out[j] = bytes(view[a - start : a - start + n])
        return out

    def _check_records(self, rec: np.ndarray, out: list[bytes]) -> None:
        """Every ``out[j]`` matching record ``rec[j]``'s xxh3 in the record table; a corrupt
        one is fetched again, up to :data:`RETRY`'s attempts; then a clear error, never the
        wrong bytes."""
        assert self.checksum is not None
        expected = self.checksum[rec].tolist()
        for attempt in range(1, storage.RETRY.attempts + 1):
            bad = [j for j, data in enumerate(out) if bytes_checksum(data) != expected[j]]
            if not bad:
                return
            if attempt == storage.RETRY.attempts:
                url = self.remote.url_of(self._runs(rec[bad[:1]])[0][0])
                raise FormatError(
                    f"{url!r} differs from its checksum in the record table after "
                    f"{attempt} reads (record {int(rec[bad[0]])}): it was replaced after the "
                    "conversion or is corrupt in the store. Convert and upload the dataset again"
                )
            time.sleep(storage.RETRY.delay(attempt))
            for j, data in zip(bad, self._fetch(rec[bad])):
                out[j] = data

    def read_into(
        self,
        records: Sequence[int] | np.ndarray,
        out: memoryview,
        where: Sequence[int] | np.ndarray,
    ) -> None:
        """Copy record ``records[k]`` into ``out[where[k]:where[k]+length]``."""
        for w, data in zip(np.asarray(where, dtype=np.int64).tolist(), self.read_many(records)):
            out[w : w + len(data)] = data


class _CachedShards:
    """What a reader of cached shards keeps: the folder, the cache, the shards' sizes and
    checksums (each download is checked against them)."""

    remote: RemoteFolder
    cache: ShardCache
    shard_names: list[str]

    def _cached_init(self, folder: RemoteFolder, cache: ShardCache, manifest: Manifest) -> None:
        self.url = folder.url
        self.remote = folder
        self.cache = cache
        self.shard_sizes = [s.bytes for s in manifest.shards]
        self.shard_digests = [s.xxh3_64 for s in manifest.shards]

    def cached(self, file: int) -> CacheEntry:
        """Shard ``file`` in the cache (downloaded first if needed), held until closed."""
        name = self.shard_names[file]
        return self.cache.open(self.remote, name, self.shard_sizes[file], self.shard_digests[file])

    def prefetch(self, files: Sequence[int]) -> int:
        """Start background downloads (this process) of shards ``files`` not yet in the cache;
        how many started (:meth:`packer.cache.ShardCache.prefetch`)."""
        started = 0
        for file in dict.fromkeys(int(f) for f in files):
            name, size = self.shard_names[file], self.shard_sizes[file]
            started += self.cache.prefetch(self.remote, name, size, self.shard_digests[file])
        return started

    def _capacity(self, handles: Any, manifest: Manifest) -> None:
        """Keep at most as many shards open (held in the cache) as fit under its limit, less
        the one being opened, so one process alone never holds the cache above its limit."""
        if self.cache.limit is not None and manifest.shards:
            largest = max(s.bytes for s in manifest.shards)
            handles.capacity = max(1, min(handles.capacity, self.cache.limit // largest - 1))


class _CachedHandle(Handle):
    """An LMDB shard's handle on its cached copy; closing it releases the cache entry."""

    def __init__(self, entry: CacheEntry, readahead: bool) -> None:
        self._entry = entry
        super().__init__(str(entry.path), readahead, None)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._entry.close()


class CachedLMDBReader(_CachedShards, lmdb.Reader):
    """An LMDB output at a URL: each shard downloaded whole into the cache before its first
    read, then read by the LMDB reader from there."""

    def __init__(
        self,
        folder: RemoteFolder,
        cache: ShardCache,
        manifest: Manifest,
        records: np.ndarray,
        **options: Any,
    ) -> None:
        lmdb.Reader.__init__(self, folder.url, manifest, records, **options)
        self._cached_init(folder, cache, manifest)
        self._capacity(self.handles, manifest)

    def _open_handle(self, shard: int) -> Handle:
        entry = self.cached(shard)
        try:
            return _CachedHandle(entry, self.readahead)
        except BaseException:
            entry.close()
            raise


class _CachedMap(MappedFile):
    """A cached shard mapped whole; closing it releases the cache entry."""

    def __init__(self, entry: CacheEntry) -> None:
        self._entry = entry
        folder = Folder(entry.path.parent)
        try:
            super().__init__(folder, entry.path.name)
        finally:
            folder.close()

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._entry.close()


class _NotCached(Exception):
    """A shard's checked download is not in the cache (yet)."""


class CachedShardReader(_CachedShards, RemoteReader):
    """An NPY or HDF5 shard output at a URL read through the cache (``cache_dir=`` or
    ``cache=True`` asked for it): a shard in the cache is mapped and sliced as a local one; a
    record of a shard not there yet is fetched by a ranged GET (checked against its xxh3 in
    the record table) while the shard's download into the cache goes on in the background
    (one per shard on the node: :meth:`packer.cache.ShardCache.prefetch`), so the first batch
    of a shuffled cold epoch waits for its records, not for every shard they lie in."""

    def __init__(
        self,
        folder: RemoteFolder,
        cache: ShardCache,
        manifest: Manifest,
        records: np.ndarray,
        max_open_files: int | None = None,
        readahead: bool | None = None,  # noqa: ARG002 - a local reader's option: maps as cached
        sample_suffix: str = "",
    ) -> None:
        RemoteReader.__init__(
            self,
            folder,
            manifest,
            records,
            sample_suffix,
            verify=True,
            max_open_files=max_open_files,
        )
        self._cached_init(folder, cache, manifest)
        self._capacity(self.handles, manifest)

    def _open_map(self, file: int) -> _CachedMap:
        name, size = self.shard_names[file], self.shard_sizes[file]
        entry = self.cache.open_present(self.remote, name, size, self.shard_digests[file])
        if entry is None:
            raise _NotCached(name)
        try:
            return _CachedMap(entry)
        except BaseException:
            entry.close()
            raise

    def _local(self, file: int) -> memoryview | None:
        """Shard ``file`` mapped from the cache, or None when it is not there yet."""
        try:
            return self.handles.get(file, lambda: self._open_map(file)).view
        except _NotCached:
            return None

    def _split(self, rec: np.ndarray) -> tuple[list[tuple[memoryview, np.ndarray]], np.ndarray]:
        """The request's records in cached shards (``(map, positions)`` per shard) and the
        positions of the others, whose shards' downloads are started."""
        near: list[tuple[memoryview, np.ndarray]] = []
        far: list[np.ndarray] = []
        missing: list[int] = []
        for file, where in self._groups(rec):
            view = self._local(file)
            if view is None:
                far.append(where)
                missing.append(file)
            else:
                near.append((view, where))
        if missing:
            self.prefetch(missing)
        return near, (np.concatenate(far) if far else np.zeros(0, np.int64))

    def read_many(self, records: Sequence[int] | np.ndarray) -> list[bytes]:
        """The stored bytes of each record, in the order asked: from the cache, or by ranged
        GETs (checked) for shards still on their way."""
        rec = np.asarray(records, dtype=np.int64)
        out: list[bytes] = [b""] * len(rec)
        near, far = self._split(rec)
        for view, where in near:
            for j in where.tolist():
                a, n = int(self.offset[rec[j]]), int(self.length[rec[j]])
                out[j] = bytes(view[a : a + n])
        if len(far):
            for j, data in zip(far.tolist(), RemoteReader.read_many(self, rec[far])):
                out[j] = data
        return out

    def read_into(
        self,
        records: Sequence[int] | np.ndarray,
        out: memoryview,
        where: Sequence[int] | np.ndarray,
    ) -> None:
        """Copy record ``records[k]`` into ``out[where[k]:where[k]+length]``."""
        rec = np.asarray(records, dtype=np.int64)
        dest = np.asarray(where, dtype=np.int64)
        near, far = self._split(rec)
        for view, positions in near:
            for j in positions.tolist():
                a, n, w = int(self.offset[rec[j]]), int(self.length[rec[j]]), int(dest[j])
                out[w : w + n] = view[a : a + n]
        if len(far):
            for j, data in zip(far.tolist(), RemoteReader.read_many(self, rec[far])):
                w = int(dest[j])
                out[w : w + len(data)] = data
