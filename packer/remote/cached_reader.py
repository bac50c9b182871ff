"""Reading an output at a URL through the node's shard cache (``packer.remote.cache``).

:class:`CachedShardReader` (NPY, HDF5; LMDB: :mod:`packer.remote.cached_lmdb`) reads whole
shards downloaded into the cache (warm epochs then read at local speed); a record whose shard is
not cached yet is served by a checked ranged GET (:class:`packer.remote.reader.RemoteReader`)
while the shard downloads in the background (up to a few % of the dataset: :data:`RANGED_SHARE`;
then a read waits for its shard). A cached shard is held (never evicted) while its handle is
open. Every record read from a cached copy is checked against the record table's xxh3 as a
ranged one is (:class:`CacheCheck`, on ``packer.formats.record_check``): a copy that differs (a flipped
byte on the disk, a file tampered with) is downloaded again and replaced in the cache, the
record read from the new copy; a second difference is an error naming the record and the URL.

The readers are picklable: the URL, the options, the tables and the cache's folder and limit; each
process opens its own client (``packer.remote.storage.RemoteFolder``) and its own cache entries.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import Any

import numpy as np

from packer.core.handles import HandleCache
from packer.core.manifest import Manifest
from packer.errors import FormatError
from packer.formats.base import copy_records
from packer.formats.files import Folder, MappedFile
from packer.formats.record_check import RecordCheck
from packer.remote.cache import CacheEntry, ShardCache
from packer.remote.reader import RemoteReader
from packer.remote.storage import RemoteFolder

__all__ = ["RANGED_FLOOR", "RANGED_SHARE", "CacheCheck", "CachedShardReader", "CachedShards"]


def _loader_workers() -> int:
    """How many DataLoader workers share the reading, seen from one of them (else 1); torch
    is asked only when already imported (the formats never import it)."""
    data = sys.modules.get("torch.utils.data")
    info = data.get_worker_info() if data is not None else None
    return max(1, int(getattr(info, "num_workers", 1))) if info is not None else 1


class _NotCached(Exception):
    """A shard's checked download is not in the cache (yet)."""


# While shards download, a reader (a DataLoader's workers together) serves at most this share
# of the dataset's bytes by ranged GETs, and each process at least RANGED_FLOOR (a first batch
# of a small dataset); past it, a read waits for its shard's download. So the first batches of
# a cold epoch come at once, whatever the order (a shuffled one touches every shard), and the
# bytes fetched twice stay a few % of a large dataset.
RANGED_SHARE = 0.04
RANGED_FLOOR = 8 << 20
AHEAD = 2  # shards fetched ahead of a reader in order
IN_ORDER = 2  # requests in a row whose highest shard moved by at most one: a reader in order


class CachedShards:
    """What a reader of cached shards keeps: the folder, the cache, the shards' sizes and
    checksums (each download is checked against them)."""

    remote: RemoteFolder
    cache: ShardCache
    shard_names: list[str]
    file: np.ndarray
    kind: str
    handles: HandleCache
    length: np.ndarray
    # the format reader's own __init__: (folder, manifest, records, **the reader options it takes)
    _format_init: Callable[..., None]

    def __init__(
        self,
        folder: RemoteFolder,
        cache: ShardCache,
        manifest: Manifest,
        records: np.ndarray,
        **options: Any,
    ) -> None:
        """The format's reader of the output at ``folder`` (:meth:`_format_init`, given the
        reader ``options``), reading its shards through ``cache``."""
        self._format_init(folder, manifest, records, **options)
        self.url = folder.url
        self.remote = folder
        self.cache = cache
        self.shard_sizes = [s.bytes for s in manifest.shards]
        self.data_bytes = sum(self.shard_sizes)
        self.shard_digests = [s.xxh3_64 for s in manifest.shards]
        self.record_digests: np.ndarray = records["checksum"]
        self._ranged = (-1, 0)  # (process, bytes it served by range)
        self._trail = (-1, -2, 0)  # (process, its last request's highest shard, requests in order)
        self._capacity(self.handles, manifest)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_ranged": (-1, 0), "_trail": (-1, -2, 0)}

    def _follow(self, files: list[int]) -> None:
        """Read shards ahead of a process reading them in order: when its last :data:`IN_ORDER`
        requests' highest shard moved by at most one each time, the next :data:`AHEAD` shards
        start downloading (a read in order then finds its shard on its way or cached, and the
        link stays busy; a shuffled reader's highest shard jumps, or is the last one). Only
        when the whole dataset fits under the cache's limit (else held shards could not make
        room for them)."""
        if not files:
            return
        top = max(files)
        pid, last, streak = self._trail
        streak = streak + 1 if pid == os.getpid() and 0 <= top - last <= 1 else 1
        self._trail = (os.getpid(), top, streak)
        fits = self.cache.limit is None or self.cache.limit >= self.data_bytes
        if streak >= IN_ORDER and fits:  # under a tighter limit, shards ahead would evict
            self.prefetch(range(top + 1, min(top + 1 + AHEAD, len(self.shard_names))))

    def _by_range(self, wanted: int) -> bool:
        """Whether ``wanted`` more bytes of a shard not cached may come by range (this
        process's part of :data:`RANGED_SHARE`, at least :data:`RANGED_FLOOR`)."""
        pid, used = self._ranged
        used = (used if pid == os.getpid() else 0) + wanted  # a forked worker counts its own
        share = RANGED_SHARE * self.data_bytes / _loader_workers()
        if used > max(share, RANGED_FLOOR):
            return False
        self._ranged = (os.getpid(), used)
        return True

    def _far(self, rec: np.ndarray) -> np.ndarray:
        """The positions in ``rec`` served by ranged GETs (their shards not cached yet, within
        this process's ranged share); the downloads of missing shards started."""
        raise NotImplementedError

    def _near_many(self, rec: np.ndarray) -> list[bytes]:
        """Records ``rec`` from their shards in the cache (downloaded or waited for first),
        not checked yet."""
        raise NotImplementedError

    def _near_into(self, rec: np.ndarray, out: Any, dest: np.ndarray) -> None:
        """Records ``rec`` from the cache copied into ``out`` at ``dest``, not checked yet."""
        raise NotImplementedError

    def _cache_check(self) -> RecordCheck:
        """The check of the records read from cached shards (:class:`CacheCheck`)."""
        return CacheCheck(self)

    def _read_many(self, rec: np.ndarray) -> list[bytes]:
        """The stored bytes of each record, in the order asked, each checked against its
        xxh3: from the cached shard (:class:`CacheCheck`), or by a ranged GET (checked by the
        ranged reader) while the shard is on its way."""
        far = self._far(rec)
        if not len(far):
            out = self._near_many(rec)
            self._cache_check().many(rec, out)
            return out
        out = [b""] * len(rec)
        for j, data in zip(far.tolist(), self._ranged_many(rec[far])):
            out[j] = data
        near = np.setdiff1d(np.arange(len(rec)), far)
        if len(near):
            got = self._near_many(rec[near])
            self._cache_check().many(rec[near], got)
            for j, data in zip(near.tolist(), got):
                out[j] = data
        return out

    def _read_into(self, rec: np.ndarray, out: memoryview, dest: np.ndarray) -> None:
        """Records ``rec`` copied into ``out`` at ``dest``, each checked as by
        :meth:`_read_many`."""
        far = self._far(rec)
        near = np.setdiff1d(np.arange(len(rec)), far) if len(far) else np.arange(len(rec))
        self._copy_far(rec, far, out, dest)
        if len(near):
            self._near_into(rec[near], out, dest[near])
            self._cache_check().into(rec[near], out, dest[near])

    def _replace(self, file: int) -> None:
        """Shard ``file``'s cached copy, found corrupt, downloaded again and renamed over in
        the cache (unless another process did so already); this process's handle on the old
        copy closed, the next read opens the new one."""
        old = self.handles.pop(file)
        try:
            if old is not None:
                bad = old._entry.identity
            else:  # closed meanwhile (a request over more shards than are kept open)
                with closing(self.cached(file)) as now:
                    bad = now.identity  # the copy there now
            self.cache.open(*self._object(file), bad=bad).close()
        finally:
            if old is not None:
                old.close()

    def _object(self, file: int) -> tuple[RemoteFolder, str, int, str]:
        return self.remote, self.shard_names[file], self.shard_sizes[file], self.shard_digests[file]

    def cached(self, file: int) -> CacheEntry:
        """Shard ``file`` in the cache (downloaded first if needed), held until closed."""
        return self.cache.open(*self._object(file))

    def _ranged_many(self, rec: np.ndarray) -> list[bytes]:
        """Records ``rec`` by ranged GETs, each checked (their shards not cached yet)."""
        raise NotImplementedError

    def _copy_far(self, rec: np.ndarray, far: np.ndarray, out: Any, dest: np.ndarray) -> None:
        """Records ``rec[far]`` by ranged GETs (:meth:`_ranged_many`), each copied into the
        buffer ``out`` at its ``dest``."""
        if len(far):
            copy_records(out, dest[far], self._ranged_many(rec[far]))

    @property
    def prefetches(self) -> bool:
        """Shards are downloaded into the cache ahead of their reads."""
        return self.layout == "shards"  # type: ignore[attr-defined]

    def prefetch(self, files: Sequence[int]) -> int:
        """Start background downloads (this process) of shards ``files`` not yet in the cache;
        how many started (:meth:`packer.remote.cache.ShardCache.prefetch`)."""
        started = 0
        for file in dict.fromkeys(int(f) for f in files):
            started += self.cache.prefetch(*self._object(file))
        return started

    def _capacity(self, handles: Any, manifest: Manifest) -> None:
        """Keep at most as many shards open (held in the cache) as fit under its limit, less
        the one being opened, so one process alone never holds the cache above its limit."""
        if self.cache.limit is not None and manifest.shards:
            largest = max(s.bytes for s in manifest.shards)
            handles.capacity = max(1, min(handles.capacity, self.cache.limit // largest - 1))


class CacheCheck(RecordCheck):
    """The check of records read from cached shards (``packer.formats.record_check``, the
    one a ranged read and a local ``check_records=True`` read use too): the shards of those
    that differ are downloaded again and replaced in the cache, those records read anew from
    the new copies; a second difference is an error naming the record and the URL."""

    attempts = 2

    def __init__(self, reader: CachedShards) -> None:
        super().__init__(reader.record_digests, reader.length)
        self.reader = reader

    def again(self, records: np.ndarray, attempt: int) -> list[bytes]:  # noqa: ARG002
        for file in sorted({int(self.reader.file[r]) for r in records.tolist()}):
            self.reader._replace(file)
        return self.reader._near_many(records)

    def refused(self, records: np.ndarray, attempt: int) -> Exception:  # noqa: ARG002
        r, record = self.reader, int(records[0])
        what = f"frame record {record}" if r.kind == "video" else f"sample {record}"
        url = r.remote.url_of(r.shard_names[int(r.file[record])])
        return FormatError(
            f"{what} read from {url!r} differs from its xxh3 in the record table, in the "
            "shard cache's copy and again in a fresh download that matched the manifest: "
            "the dataset's record table and shard disagree (uploaded again part way?). "
            "Convert and upload the dataset again"
        )


class _EntryFolder(Folder):
    """The cache folder as a :class:`MappedFile` sees it: it opens only the held entry's file
    (:meth:`packer.core.file_locks.CacheEntry.open_data`: no link followed, the very file checked)."""

    def __init__(self, entry: CacheEntry) -> None:
        self.path, self.fd, self._entry = entry.path.parent, -1, entry

    def open(self, name: str, expected: Any = None) -> int:  # noqa: ARG002
        return self._entry.open_data()


class _CachedMap(MappedFile):
    """A cached shard mapped whole; closing it releases the cache entry."""

    def __init__(self, entry: CacheEntry) -> None:
        self._entry = entry
        super().__init__(_EntryFolder(entry), entry.path.name)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._entry.close()


class CachedShardReader(CachedShards, RemoteReader):
    """An NPY or HDF5 shard output at a URL read through the cache (``cache_dir=`` or
    ``cache=True`` asked for it): a shard in the cache is mapped and sliced as a local one; a
    record of a shard not there yet is fetched by a ranged GET (checked against its xxh3 in
    the record table) while the shard's download into the cache goes on in the background
    (one per shard on the node: :meth:`packer.remote.cache.ShardCache.prefetch`), up to
    :data:`RANGED_SHARE` of the dataset (a DataLoader's workers share it); past it a read
    waits for its shard. So the first batches of a cold epoch wait for their records, not for
    every shard they lie in, and the bytes fetched twice stay a few % of the dataset."""

    RANGED = False  # read from the cache but for a first few % of the bytes

    def _format_init(
        self,
        folder: RemoteFolder,
        manifest: Manifest,
        records: np.ndarray,
        max_open_files: int | None = None,
        readahead: bool | None = None,  # noqa: ARG002 - a local reader's option: maps as cached
        sample_suffix: str = "",
    ) -> None:
        RemoteReader.__init__(
            self, folder, manifest, records, sample_suffix, max_open_files=max_open_files
        )

    def _wait_map(self, file: int) -> memoryview:
        """Shard ``file`` mapped from the cache, downloaded (or waited for) first."""

        def opener() -> _CachedMap:
            entry = self.cached(file)
            try:
                return _CachedMap(entry)
            except BaseException:
                entry.close()
                raise

        return self.handles.get(file, opener).view

    def _open_map(self, file: int) -> _CachedMap:
        entry = self.cache.open_present(*self._object(file))
        if entry is None:
            raise _NotCached(self.shard_names[file])
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

    def _far(self, rec: np.ndarray) -> np.ndarray:
        """The positions of the request's records fetched by range: every missing shard's
        download is started; past this process's part of :data:`RANGED_SHARE`, a shard is
        waited for (read from the cache by :meth:`_near_many`)."""
        groups = [(file, where, self._local(file)) for file, where in self._groups(rec)]
        self._follow([file for file, _, _ in groups])
        missing = [file for file, _, view in groups if view is None]
        if missing:
            self.prefetch(missing)
        far = [
            where
            for _, where, view in groups
            if view is None and self._by_range(int(self.length[rec[where]].sum()))
        ]
        return np.concatenate(far) if far else np.zeros(0, np.int64)

    def _near_many(self, rec: np.ndarray) -> list[bytes]:
        out: list[bytes] = [b""] * len(rec)
        for file, where in self._groups(rec):
            view = self._wait_map(file)
            for j in where.tolist():
                a, n = int(self.offset[rec[j]]), int(self.length[rec[j]])
                out[j] = bytes(view[a : a + n])
        return out

    def _near_into(self, rec: np.ndarray, out: Any, dest: np.ndarray) -> None:
        for file, where in self._groups(rec):
            view = self._wait_map(file)
            for j in where.tolist():
                a, n, w = int(self.offset[rec[j]]), int(self.length[rec[j]]), int(dest[j])
                out[w : w + n] = view[a : a + n]

    def _ranged_many(self, rec: np.ndarray) -> list[bytes]:
        return RemoteReader._read_many(self, rec)
