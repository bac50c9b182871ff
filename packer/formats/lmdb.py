"""LMDB: shards ``shard-NNNNN.mdb`` (one file each, ``subdir=False``), one LMDB record per record.

The key is the record's number within its shard as 8 big-endian bytes, so keys are appended in
order and records lie on disk in dataset order; the value is the stored bytes (an image, or one
frame of a video: a video's frames are consecutive records of one shard). ``records.npy`` gives
each record's shard (``file``) and the byte offset of its value in the shard file (``offset``,
read back from the finished shard; -1 where it cannot be told); a record's key is its position
among its shard's records. Only the ``"shards"`` layout exists.

Reading: each process opens each shard once (``readonly=True, lock=False``) and keeps one
long-lived ``buffers=True`` read transaction; a batch or a clip is one ``getmulti`` per shard,
or one cursor walk where its records are consecutive (an in-order batch).
Readahead defaults to on for images (measured: off made cold image reads several times slower
than plain files) and off for video (a clip reads a few frames of a video: readahead would read
the frames around them too). Without readahead, a clip first asks the kernel for exactly its
frames' pages at once (``POSIX_FADV_WILLNEED`` at the recorded offsets): py-lmdb touches every
page of a value inside ``getmulti``, which would otherwise be one synchronous read per page.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packer.core.manifest import Manifest, ShardInfo, fsync_dir, shard_name
from packer.errors import FormatError
from packer.formats.base import FilePart, ReaderBase
from packer.formats.lmdb_env import Handle
from packer.formats.writer import WriterBase

__all__ = ["NAME", "Reader", "Writer", "record_key"]

NAME = "lmdb"
SUFFIXES = (".lmdb",)
SHARD_SUFFIX = ".mdb"
LAYOUTS = ("shards",)
OFFSETS = "bytes"  # records.npy offsets: each value's byte offset in the shard (-1: unknown)
TRANSCODE = None
_PAGE = 4096
_TXN_RECORDS = 1024  # commit a write transaction every this many records ...
_TXN_BYTES = 64 << 20  # ... or this many bytes, whichever comes first (deterministic)
_OFFSET_CHUNK = 8192  # value_offsets maps the shard anew for every this many records


def record_key(position: int) -> bytes:
    """The LMDB key of the sample at ``position``."""
    return position.to_bytes(8, "big")


def initial_map_size(planned_bytes: int) -> int:
    """The map size a shard starts with; it doubles on ``MapFullError``."""
    # Records above ~2 KB go to overflow pages: at most one extra page each, plus B-tree pages.
    return planned_bytes + planned_bytes // 2 + (16 << 20)


class Writer(WriterBase):
    """Write samples into LMDB shards, in order; a context manager."""

    SHARD_SUFFIX = SHARD_SUFFIX

    def _fresh(self) -> None:
        self._env: Any = None
        self._txn: Any = None
        self._count = 0
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self.final_offsets: np.ndarray | None = None  # file offsets of the last shard's values

    def _open_shard(self, shard: int) -> None:
        path = self.root / shard_name(shard, SHARD_SUFFIX)
        self._env = lmdb.open(
            str(path),
            subdir=False,
            lock=False,
            map_size=initial_map_size(self.planned[shard]),
            sync=False,
            metasync=False,
            readahead=False,
            meminit=True,
        )
        self._txn = self._env.begin(write=True)
        self._count = 0

    def write(self, shard: int, key: str, records: Sequence[bytes]) -> list[int]:
        """Append one sample's records to ``shard``; return their record numbers in it."""
        try:
            self._roll(shard)
            first = self._count
            for record in records:
                self._put(record_key(self._count), record)
                self._count += 1
        except lmdb.Error as exc:  # LMDB reports a failed write (e.g. disk full) as EIO
            raise OSError(errno.EIO, f"LMDB write failed: {exc}") from exc
        return list(range(first, self._count))

    def _put(self, key: bytes, data: bytes) -> None:
        self._pending.append((key, data))
        self._pending_bytes += len(data)
        try:
            self._txn.put(key, data, append=True)
        except lmdb.MapFullError:
            self._grow_and_replay()
        if len(self._pending) >= _TXN_RECORDS or self._pending_bytes >= _TXN_BYTES:
            self._txn.commit()
            self._txn = self._env.begin(write=True)
            self._pending = []
            self._pending_bytes = 0

    def _grow_and_replay(self) -> None:
        """Double the map size and redo the open transaction's records (kept in memory)."""
        while True:
            self._txn.abort()
            self._env.set_mapsize(self._env.info()["map_size"] * 2)
            self._txn = self._env.begin(write=True)
            try:
                for key, value in self._pending:
                    self._txn.put(key, value, append=True)
                return
            except lmdb.MapFullError:
                continue

    def finish_shard(self) -> ShardInfo | None:
        """Close the open shard (if any), fsync it and return its manifest entry."""
        if self._env is None:
            return None
        try:
            self._txn.commit()
            self._env.sync(True)
        except lmdb.Error as exc:
            raise OSError(errno.EIO, f"LMDB commit failed: {exc}") from exc
        self._env.close()
        path = self._shard_path()
        fsync_dir(self.root)
        self.final_offsets = value_offsets(path, self._count)
        entry = self._shard_entry(self._count)
        self._env = self._txn = None
        self._current = -1
        self._pending = []
        self._pending_bytes = 0
        return entry

    def _discard(self) -> None:
        if self._env is not None:
            self._txn.abort()
            self._env.close()
            self._env = self._txn = None


def _map_base(path: Path) -> int | None:
    """The address where this process mapped ``path`` from file offset 0 (``/proc/self/maps``),
    or None where it cannot be told."""
    st = os.stat(path)
    try:
        with open("/proc/self/maps") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) >= 6 and int(fields[4]) == st.st_ino and int(fields[2], 16) == 0:
                    major, minor = (int(x, 16) for x in fields[3].split(":"))
                    if os.makedev(major, minor) == st.st_dev:
                        return int(fields[0].split("-")[0], 16)
    except (OSError, ValueError):
        return None
    return None


def value_offsets(path: Path, count: int, chunk: int = _OFFSET_CHUNK) -> np.ndarray:
    """The byte offset in the shard file of each record's value (``records.npy`` keeps it, so a
    clip can ask the kernel for exactly its frames' pages before LMDB touches them), or -1s
    where the offsets cannot be told (no ``/proc``).

    Walking the values touches every leaf page of the map, which then counts in this process's
    resident memory until the map is closed: a shard of a million tiny images is ~800 MB of
    them. So the walk maps the file anew for every ``chunk`` records (at most two pages each: a
    leaf and an overflow header), which keeps that bounded (measured: 182 → ~40 MB at 200,000
    samples)."""
    offsets = np.zeros(count, dtype=np.int64)
    done = 0
    while done < count:
        got = _offsets_from(path, done, offsets[done : done + chunk])
        if got is None:
            return np.full(count, -1, dtype=np.int64)
        if got == 0:
            break
        done += got
    if done != count or _offsets_from(path, count, offsets[:0]) != 0:
        raise OSError(errno.EIO, f"LMDB shard {str(path)!r} does not hold {count} records")
    return offsets


def _offsets_from(path: Path, first: int, out: np.ndarray) -> int | None:
    """Fill ``out`` with the offsets of records ``first ...`` (one map of the shard); return how
    many records there were (0 past the end; one, ``out`` left alone, when ``out`` is empty),
    or None where the map's address cannot be told."""
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_readers=1)
    try:
        with env.begin(buffers=True) as txn:
            cursor = txn.cursor()
            if not cursor.set_range(record_key(first)):
                return 0
            if not len(out):
                return 1
            base = None
            n = 0
            for _, value in cursor:
                if len(value):
                    if base is None and (base := _map_base(path)) is None:
                        return None
                    out[n] = np.frombuffer(value, dtype=np.uint8).ctypes.data - base
                n += 1
                if n == len(out):
                    break
            return n
    finally:
        env.close()


class Reader(ReaderBase):
    """Read records from LMDB shards.

    Args:
        readahead: let the kernel read ahead around each record (default: on for images, off
            for video; see the module docstring). A shard already open in this process keeps
            the setting of its first opener (:mod:`packer.formats.lmdb_env`): only advice.
        max_open_files: the most shards one process keeps open.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        records: np.ndarray,
        readahead: bool | None = None,
        max_open_files: int | None = None,
    ) -> None:
        super().__init__(root, manifest, records, max_open_files)
        self.readahead = manifest.kind != "video" if readahead is None else bool(readahead)
        # A record's LMDB key is its number within its shard: the shards' records are contiguous
        # runs in shard order, so it is the record's number less its shard's first record's.
        self.shard_counts = np.array([s.samples for s in manifest.shards], dtype=np.int64)
        self.shard_first = np.concatenate(([0], np.cumsum(self.shard_counts)[:-1])).astype(np.int64)

    def read_exactly(self) -> None:
        """Open the environments without the kernel's readahead (``MDB_NORDAHEAD``)."""
        self.readahead = False

    def _reads_ahead(self) -> bool:
        return self.readahead

    def _shard(self, shard: int) -> Handle:
        return self.handles.get(shard, lambda: self._open_handle(shard))

    def _open_handle(self, shard: int) -> Handle:
        """Open shard ``shard`` (a remote dataset's reader opens its cached copy instead)."""
        path = self.folder().path_of(self.shard_names[shard])
        return Handle(path, self.readahead, self.shard_id(shard))

    def _lookup(self, file: int, records: np.ndarray, buffers: bool) -> list[Any]:
        """The values of ``records`` (all of shard ``file``), in the order given: ``bytes``, or
        views of the map with ``buffers``.

        A record's key is its number less its shard's first record's: the table was checked at
        open to list records in shard order, each shard's run of its record count
        (:func:`packer.read.store.validate_tables`), so every key lies in its shard. A run of
        consecutive records, ascending, is one walk of the cursor (no lookup per record); any
        other batch one ``getmulti``."""
        first = int(records[0]) - int(self.shard_first[file])
        n = len(records)
        cursor = self._shard(file).cursor
        try:
            if n > 1 and int(records[-1]) - int(records[0]) == n - 1:
                if bool((records[1:] - records[:-1] == 1).all()):
                    values = self._walk(cursor, file, first, n)
                    return values if buffers else [bytes(v) for v in values]
            keys = (records - self.shard_first[file]).astype(">u8").view("V8").tolist()
            pairs = cursor.getmulti(keys)
        except lmdb.Error as exc:
            raise FormatError(f"cannot read {self.shard_names[file]!r}: {exc}") from exc
        if len(pairs) != n:
            missing = sorted(set(keys) - {bytes(k) for k, _ in pairs})
            raise self._missing(file, int.from_bytes(missing[0], "big"))
        return [value for _, value in pairs] if buffers else [bytes(v) for _, v in pairs]

    def _walk(self, cursor: Any, file: int, first: int, n: int) -> list[Any]:
        """The values of keys ``first ... first + n - 1``, walking the cursor from ``first``.

        Keys are distinct and the walk ascends: ending on key ``first + n - 1`` after ``n``
        values proves no key of the run is missing."""
        if not cursor.set_key(record_key(first)):
            raise self._missing(file, first)
        values = list(islice(cursor.iternext(keys=False, values=True), n))
        if len(values) != n or cursor.key() != record_key(first + n - 1):
            raise FormatError(
                f"records {first} to {first + n - 1} of {self.shard_names[file]!r} are not "
                "consecutive keys there: the shard is damaged; convert the source again"
            )
        return values

    def _missing(self, file: int, number: int) -> FormatError:
        return FormatError(
            f"record {number} is missing from {self.shard_names[file]!r}: the shard is damaged; "
            "convert the source again"
        )

    def _prefetch(self, file: int, records: np.ndarray) -> None:
        """Without readahead, ask for the pages of several records at once (see
        :meth:`Handle.prefetch`) where their offsets are known. What counts is the shard's
        environment: it may have been opened by another reader of this process with another
        setting (:mod:`packer.formats.lmdb_env`)."""
        if len(records) > 1 and not (handle := self._shard(file)).readahead:
            starts = self.offset[records]
            if starts[0] >= 0:
                handle.prefetch(starts.tolist(), self.length[records].tolist())

    def _read_many(self, asked: np.ndarray) -> list[bytes]:
        """The stored bytes of each record, in the order asked.

        A batch within one shard (records lie in shard order, so its lowest and highest record
        tell) is one cursor walk when its records are consecutive, else one ``getmulti``, its
        keys ascending (a batch that is not is sorted, then put back in the order asked); a
        batch across shards goes shard by shard (:meth:`ReaderBase._read_many`).
        """
        if asked.ndim != 1 or len(asked) == 0:
            return super()._read_many(asked)
        rec, order = asked, None
        if len(rec) > 1 and (rec[1:] < rec[:-1]).any():
            order = np.argsort(rec, kind="stable")
            rec = rec[order]
        low, high = int(rec[0]), int(rec[-1])
        if low < 0 or high >= len(self.length):
            raise IndexError(f"record out of range for a dataset of {len(self.length)} records")
        file = int(self.file[low])
        if file != int(self.file[high]):
            return super()._read_many(asked)
        self._prefetch(file, rec)
        values = self._lookup(file, rec, False)
        if order is None:
            return values
        out: list[bytes] = [b""] * len(rec)
        for j, value in zip(order.tolist(), values):
            out[j] = value
        return out

    def _read_file(self, part: FilePart) -> list[bytes]:
        rec = np.asarray(part.records, dtype=np.int64)
        self._prefetch(part.file, rec)
        return self._lookup(part.file, rec, False)

    def _read_file_into(self, part: FilePart, out: memoryview, where: list[int]) -> None:
        rec = np.asarray(part.records, dtype=np.int64)
        self._prefetch(part.file, rec)
        for value, w, n in zip(self._lookup(part.file, rec, True), where, part.lengths):
            if len(value) != n:
                name = self.shard_names[part.file]
                raise FormatError(f"a record of {name!r} has the wrong length")
            out[w : w + n] = value
