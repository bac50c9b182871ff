"""Readers of outputs at a URL.

:class:`RemoteReader` reads records as byte ranges of objects (NPY and HDF5 shards and
per-sample files): a request's records are grouped by file and sorted by offset, nearby ones
coalesced into one ranged GET (``packer.storage.GAP``), and every run of the request is in
flight at once (fsspec's ``cat_ranges``). BMP records are whole objects (one file each), each
fetched by one GET and checked against the record table's xxh3 before it is served.

:class:`CachedLMDBReader` and :class:`CachedShardReader` read whole shards downloaded into the
node's shard cache (``packer.cache``): LMDB needs a local file; NPY/HDF5 shards are cached when
asked (warm epochs then read at local speed). A cached shard is held (never evicted) while its
handle is open.

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
from packer.formats.base import FileReader, ReaderBase
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
    ) -> None:
        super().__init__(folder.url, manifest, records)
        self.url = folder.url
        self.remote = folder
        self.sample_suffix = sample_suffix
        self.gap = gap
        # BMP: a record is a whole file, checked against its xxh3 (the object has no other check)
        self.checksum: np.ndarray | None = records["checksum"] if manifest.format == "bmp" else None

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
            if self.checksum is not None:  # BMP: record k is file record_name(key, kind, k)
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
        all runs of the call in flight together."""
        rec = np.asarray(records, dtype=np.int64)
        out: list[bytes] = [b""] * len(rec)
        names, starts, stops, pieces = self._runs(rec)
        if not names:
            return out
        blocks = self.remote.read_runs(names, starts, stops)
        if self.checksum is not None:
            blocks = self._checked_files(rec, names, stops, blocks, pieces)
        for block, (start, positions, offsets, lengths) in zip(blocks, pieces):
            view = memoryview(block)
            for j, a, n in zip(positions, offsets, lengths):
                out[j] = bytes(view[a - start : a - start + n])
        return out

    def _checked_files(
        self, rec: np.ndarray, names: list[str], sizes: list[int], blocks: list[bytes], pieces: Any
    ) -> list[bytes]:
        """``blocks``, whole record files, each matching its xxh3 (a corrupt body is fetched
        again, up to :data:`RETRY`'s attempts; then a clear error, never the wrong bytes)."""
        assert self.checksum is not None
        expected = [int(self.checksum[rec[piece[1][0]]]) for piece in pieces]
        for attempt in range(1, storage.RETRY.attempts + 1):
            bad = [k for k, block in enumerate(blocks) if bytes_checksum(block) != expected[k]]
            if not bad:
                return blocks
            if attempt == storage.RETRY.attempts:
                url = self.remote.url_of(names[bad[0]])
                raise FormatError(
                    f"{url!r} differs from its checksum in the record table after "
                    f"{attempt} reads: it was replaced after the conversion or is corrupt in "
                    "the store. Convert and upload the dataset again"
                )
            time.sleep(storage.RETRY.delay(attempt))
            again = self.remote.read_runs(
                [names[k] for k in bad], [0] * len(bad), [sizes[k] for k in bad]
            )
            for k, block in zip(bad, again):
                blocks[k] = block
        return blocks

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


class CachedShardReader(_CachedShards, FileReader):
    """An NPY or HDF5 shard output at a URL read through the cache: each shard downloaded
    whole on first touch, then mapped and sliced as a local one (``cache_dir=`` or
    ``cache=True`` asked for it)."""

    def __init__(
        self,
        folder: RemoteFolder,
        cache: ShardCache,
        manifest: Manifest,
        records: np.ndarray,
        **options: Any,
    ) -> None:
        FileReader.__init__(self, folder.url, manifest, records, **options)
        self._cached_init(folder, cache, manifest)
        self._capacity(self.handles, manifest)

    def _mapped(self, file: int) -> memoryview:
        def opener() -> _CachedMap:
            entry = self.cached(file)
            try:
                return _CachedMap(entry)
            except BaseException:
                entry.close()
                raise

        return self.handles.get(file, opener).view
