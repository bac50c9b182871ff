"""An LMDB output at a URL read through the node's shard cache (``packer.remote.cache``).

LMDB reads a local file: a shard is read by py-lmdb once its checked download is in the cache.
Until then its records are served by ranged GETs: the record table holds each value's byte
offset in its shard file (``packer.formats.lmdb.value_offsets``, recorded at conversion), so a
record is a byte range like an NPY one, fetched by :class:`packer.remote.reader.RemoteReader`
and checked against its xxh3, while the shard downloads in the background — within the same
bound as NPY and HDF5 (:data:`packer.remote.cached_reader.RANGED_SHARE` of the dataset, at
least :data:`packer.remote.cached_reader.RANGED_FLOOR` a process; past it a read waits for its
shard). A record whose offset is unknown (``-1``: written where ``/proc`` was missing) always
waits for its shard. So a shuffled first batch no longer waits for every shard it touches.

Every record read from a cached copy is checked against the record table's xxh3
(:class:`packer.remote.cached_reader.CacheCheck`): a copy that differs is
downloaded again and replaced, the record read anew; a second difference is an error.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from packer.core.manifest import Manifest
from packer.formats import lmdb
from packer.formats.lmdb_env import Handle
from packer.remote.cache import CacheEntry
from packer.remote.cached_reader import CachedShards
from packer.remote.reader import RemoteReader
from packer.remote.storage import RemoteFolder

__all__ = ["CachedLMDBReader"]


class _CachedHandle(Handle):
    """An LMDB shard's handle on its cached copy; closing it releases the cache entry."""

    def __init__(self, entry: CacheEntry, readahead: bool) -> None:
        self._entry = entry
        # LMDB opens a path: it is given this descriptor's (no link followed, the very file
        # checked), so a link planted in the cache is never what LMDB reads
        self._data = entry.open_data()
        pinned = f"/proc/self/fd/{self._data}"
        try:
            super().__init__(pinned if os.path.exists(pinned) else str(entry.path), readahead, None)
        except BaseException:
            os.close(self._data)
            raise

    def close(self) -> None:
        try:
            super().close()
        finally:
            os.close(self._data)
            self._entry.close()


class CachedLMDBReader(CachedShards, lmdb.Reader):
    """An LMDB output at a URL: each shard read by py-lmdb from its copy in the cache; a record
    of a shard not cached yet served by a checked ranged GET while the shard downloads (see the
    module docstring)."""

    def _format_init(
        self, folder: RemoteFolder, manifest: Manifest, records: np.ndarray, **options: Any
    ) -> None:
        lmdb.Reader.__init__(self, folder.url, manifest, records, **options)
        self._ranges = RemoteReader(folder, manifest, records, "")

    def _ranged_many(self, rec: np.ndarray) -> list[bytes]:
        return self._ranges.read_many(rec)

    def _open_handle(self, shard: int) -> Handle:
        return self._handle_on(self.cached(shard))

    def _handle_on(self, entry: CacheEntry) -> Handle:
        try:
            return _CachedHandle(entry, self.readahead)
        except BaseException:
            entry.close()
            raise

    def _present(self, file: int) -> bool:
        """Whether shard ``file``'s checked copy is in the cache (then opened here, held from
        now on like any shard read); never a download, never a wait."""
        entry = self.cache.open_present(*self._object(file))
        if entry is None:
            return False
        opened: list[bool] = []

        def opener() -> Handle:
            opened.append(True)
            return self._handle_on(entry)

        self.handles.get(file, opener)
        if not opened:  # another thread opened it meanwhile: this hold is not needed
            entry.close()
        return True

    def _far(self, rec: np.ndarray) -> np.ndarray:
        """The positions in ``rec`` served by ranged GETs: records of shards neither open here
        nor in the cache, whose offsets are known, within this process's ranged share; those
        shards' downloads started in the background. Past the share a read downloads (or
        waits for) its shard, as before the first batch came by range."""
        far: list[np.ndarray] = []
        started: list[int] = []
        groups = self._groups(rec)
        self._follow([file for file, _ in groups])
        for file, where in groups:
            if self.handles.holds(file) or self._present(file):
                continue
            chosen = rec[where]
            known = bool((self.offset[chosen] >= 0).all())
            if known and self._by_range(int(self.length[chosen].sum())):
                far.append(where)
                started.append(file)
        if started:
            self.prefetch(started)
        return np.concatenate(far) if far else np.zeros(0, np.int64)

    def _near_many(self, rec: np.ndarray) -> list[bytes]:
        return lmdb.Reader._read_many(self, rec)

    def _near_into(self, rec: np.ndarray, out: Any, dest: np.ndarray) -> None:
        lmdb.Reader._read_into(self, rec, out, dest)
