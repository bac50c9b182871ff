"""The storage core's contracts, and what every format's reader shares.

A format module (``packer.formats.lmdb``, ``npy``, ``hdf5``, ``bmp``) stores *records* (an
image is one record, a video one record per frame) and declares:

- ``NAME``, ``SUFFIXES`` (destination suffixes), ``SHARD_SUFFIX``, ``LAYOUTS`` (the layouts it
  writes, ``"shards"`` and/or ``"per-sample"``), ``TRANSCODE`` (None, or a function applied to
  every record's bytes at conversion, e.g. JPEG -> BMP);
- ``Writer(root, planned_shard_bytes, layout, kind)`` meeting
  :class:`packer.formats.writer.Writer` (built on its ``WriterBase``);
- ``Reader(root, manifest, records, **options)`` meeting :class:`Reader`, built on
  :class:`ReaderBase`, which groups a request by file and calls the format's per-file reads.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from packer.core.contained import check_relative, open_folder
from packer.core.cpus import memory_available
from packer.core.handles import HandleCache
from packer.core.keytable import KeyTable
from packer.core.manifest import KEYS_NAME, Manifest, ShardInfo
from packer.errors import FormatError
from packer.formats.files import (
    EXACT,
    WHOLE,
    Folder,
    Identity,
    MappedFile,
    OpenFile,
    identity,
    read_ranges,
    read_ranges_into,
    shard_readahead,
)

__all__ = [
    "LAYOUTS",
    "FilePart",
    "FileReader",
    "Reader",
    "ReaderBase",
    "RecordReads",
    "Records",
    "copy_records",
    "shard_identities",
]

LAYOUTS = ("shards", "per-sample")


Records = Sequence[int] | np.ndarray  # record numbers (and places in a buffer): ints, flat


class Reader(Protocol):
    """Reads records' bytes; picklable, handles open lazily in each process."""

    def read_many(self, records: Records) -> list[bytes]:
        """The stored bytes of each record, in the order asked."""
        ...

    def read_into(self, records: Records, out: memoryview, where: Records) -> None:
        """Copy record ``records[k]`` into ``out[where[k]:]``, with no ``bytes`` per record."""
        ...

    def close(self) -> None:
        """Close this process's handles (they reopen on the next read)."""
        ...


def copy_records(out: memoryview, where: Records, records: Sequence[bytes]) -> None:
    """Copy ``records[k]`` into ``out[where[k]:where[k]+len(records[k])]``."""
    for w, data in zip(np.asarray(where, dtype=np.int64).tolist(), records):
        out[w : w + len(data)] = data


class RecordReads:
    """The reads every reader serves (:class:`Reader`'s, and :meth:`read`): the records asked,
    and the places they go, taken as flat int64 arrays here, once; a reader implements
    ``_read_many(rec)`` and ``_read_into(rec, out, dest)`` on those arrays."""

    def read_many(self, records: Records) -> list[bytes]:
        """The stored bytes of each record, in the order asked."""
        return self._read_many(np.asarray(records, dtype=np.int64))

    def read_into(self, records: Records, out: memoryview, where: Records) -> None:
        """Copy record ``records[k]`` into ``out[where[k]:where[k]+length]``, with no
        ``bytes`` per record."""
        rec = np.asarray(records, dtype=np.int64)
        self._read_into(rec, out, np.asarray(where, dtype=np.int64))

    def read(self, record: int) -> bytes:
        """The stored bytes of one record."""
        return self.read_many([record])[0]

    def _read_many(self, rec: np.ndarray) -> list[bytes]:
        raise NotImplementedError

    def _read_into(self, rec: np.ndarray, out: memoryview, dest: np.ndarray) -> None:
        raise NotImplementedError


def shard_identities(root: Path, manifest: Manifest, dir_fd: int | None = None) -> list[Identity]:
    """Stat every shard the manifest names (no open) in the dataset folder (``dir_fd``, or
    ``root``): each must be a regular file of the recorded size, not a link. Returns their
    identities, so readers open exactly them.

    Raises:
        FormatError: a shard is missing, not a regular file (a symlink, a FIFO), or of the wrong
            size.
    """
    out = []
    folder = open_folder(root) if dir_fd is None else dir_fd
    try:
        for shard in manifest.shards:
            out.append(_shard_identity(root, folder, shard))
    finally:
        if dir_fd is None:
            os.close(folder)
    return out


def _shard_identity(root: Path, folder: int, shard: ShardInfo) -> Identity:
    path = root / shard.name
    try:
        st = os.stat(check_relative(shard.name, "shard"), dir_fd=folder, follow_symlinks=False)
    except OSError as exc:
        raise FormatError(
            f"shard {str(path)!r} of {str(root)!r} cannot be opened: {exc.strerror}"
        ) from exc
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"shard {str(path)!r} is not a regular file (a symlink?)")
    if st.st_size != shard.bytes:
        raise FormatError(
            f"shard {str(path)!r} has {st.st_size} bytes but the manifest records "
            f"{shard.bytes}: it is truncated or was modified; convert again"
        )
    return identity(st)


class FilePart(NamedTuple):
    """The records of one request that lie in data file ``file``, sorted by offset, with their
    ``starts`` (offsets in the file) and ``lengths``."""

    file: int
    records: list[int]
    starts: list[int]
    lengths: list[int]


class ReaderBase(RecordReads):
    """Picklable state of every reader: the root, the record columns, a handle cache.

    Subclasses implement ``_read_file(part) -> list[bytes]`` and may override
    ``_read_file_into(part, out, where)`` (by default a copy of ``_read_file``'s result): a
    :class:`FilePart` holds one file's records of a request, sorted by their offsets.
    """

    CACHE = 4096  # most handles one process keeps open (least recently used closed first)
    PER_SAMPLE_CACHE = 256  # the same for per-sample files (descriptors: one per video)
    RANGED = False  # each request's records are fetched by ranged GETs (a URL, no cache)

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        records: np.ndarray,
        max_open_files: int | None = None,
    ) -> None:
        self.root = Path(root)
        self.kind = manifest.kind
        self.layout = manifest.opts.layout
        self.shard_names = [s.name for s in manifest.shards]
        # Views of the (memory-mapped) record table: no copy per process.
        self.file: np.ndarray = records["file"]
        self.offset: np.ndarray = records["offset"]
        self.length: np.ndarray = records["length"]
        default = self.PER_SAMPLE_CACHE if self.layout == "per-sample" else self.CACHE
        self.handles = HandleCache(max_open_files or default)
        self.pinned = HandleCache(1)  # the dataset folder's descriptor, outside the LRU
        # Mapped on first use (only per-sample layouts need keys to read; they must name files).
        self._keys = KeyTable(
            self.root / KEYS_NAME, manifest.num_samples, self.layout == "per-sample"
        )
        self.root_id: tuple[int, int] | None = None
        self.shard_ids: list[Identity] | None = None

    def pin(
        self,
        root_id: tuple[int, int],
        shard_ids: list[Identity] | None,
        keys: KeyTable | None = None,
    ) -> None:
        """Read only the folder, shards and keys seen when the dataset was opened: a folder,
        shard or ``keys.txt`` replaced since (``--overwrite``) is refused, never read under
        this index (``keys``: the table loaded and checked at open)."""
        self.root_id, self.shard_ids = root_id, shard_ids
        if keys is not None:
            self._keys = keys

    def read_exactly(self) -> None:
        """From now on, read only the pages of the records asked for, no readahead around
        them (a pass over a small share of each sample: captions stored beside images). The
        handles opened after this call follow it; a reader whose reads are exact already (a
        URL's ranged GETs) has nothing to change."""

    def _reads_ahead(self) -> bool:
        """Whether this reader reads whole shards (then shards ahead are worth asking for)."""
        return False

    @property
    def prefetches(self) -> bool:
        """Whether :meth:`prefetch` can fetch anything ahead of its reads."""
        return self.layout == "shards" and self._reads_ahead()

    def prefetch(self, files: Sequence[int]) -> int:
        """Ask the kernel to read shards ``files`` of a local output into the page cache in
        the background (``POSIX_FADV_WILLNEED`` queues the reads and returns), so the reads of
        those shards that follow find them there; how many were asked for. Only where the
        reader reads whole shards (:attr:`prefetches`): never for exact reads (a caption-only
        pass) or a dataset larger than the memory."""
        if not self.prefetches or not hasattr(os, "posix_fadvise"):
            return 0
        folder, asked = self.folder(), 0
        for file in dict.fromkeys(int(f) for f in files):
            fd = folder.open(self.shard_names[file], self.shard_id(file))
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
            asked += 1
        return asked

    def folder(self) -> Folder:
        """This process's descriptor of the dataset folder."""
        return self.pinned.get(0, lambda: Folder(self.root, self.root_id))

    def shard_id(self, file: int) -> Identity | None:
        """The identity shard ``file`` had when the dataset was opened (None if not pinned)."""
        return None if self.shard_ids is None else self.shard_ids[file]

    def __len__(self) -> int:
        return len(self.length)

    @property
    def keys(self) -> KeyTable:
        """The sample keys, read lazily from ``keys.txt`` (no ``str`` per key until asked)."""
        return self._keys

    def shard_path(self, file: int) -> Path:
        """The path of shard ``file``."""
        return self.root / self.shard_names[file]

    def _read_file(self, part: FilePart) -> list[bytes]:
        raise NotImplementedError

    def _read_file_into(self, part: FilePart, out: memoryview, where: list[int]) -> None:
        copy_records(out, where, self._read_file(part))

    def _groups(self, records: Records) -> list[tuple[int, np.ndarray]]:
        """``(file, positions in the request sorted by offset)`` for every file touched."""
        rec = np.asarray(records, dtype=np.int64)
        if rec.ndim != 1:
            raise TypeError("records must be a flat sequence of integers")
        if len(rec) == 0:
            return []
        if rec.min() < 0 or rec.max() >= len(self.length):
            raise IndexError(f"record out of range for a dataset of {len(self.length)} records")
        files = self.file[rec]
        if (files == files[0]).all():
            where = np.argsort(self.offset[rec], kind="stable")
            return [(int(files[0]), where)]
        order = np.lexsort((self.offset[rec], files))
        cuts = np.flatnonzero(np.diff(files[order])) + 1
        return [(int(files[g[0]]), g) for g in np.split(order, cuts)]

    def _parts(self, rec: np.ndarray) -> list[tuple[np.ndarray, FilePart]]:
        """``(positions in the request, their FilePart)`` for every file ``rec`` touches."""
        parts = []
        for file, where in self._groups(rec):
            chosen = rec[where]
            starts, lengths = self.offset[chosen].tolist(), self.length[chosen].tolist()
            parts.append((where, FilePart(file, chosen.tolist(), starts, lengths)))
        return parts

    def _read_many(self, rec: np.ndarray) -> list[bytes]:
        out: list[bytes] = [b""] * len(rec)
        for where, part in self._parts(rec):
            for j, d in zip(where.tolist(), self._read_file(part)):
                out[j] = d
        return out

    def _read_into(self, rec: np.ndarray, out: memoryview, dest: np.ndarray) -> None:
        for pos, part in self._parts(rec):
            self._read_file_into(part, out, dest[pos].tolist())

    def lengths(self, records: Records) -> np.ndarray:
        """Stored byte lengths of ``records``."""
        return self.length[np.asarray(records, dtype=np.int64)]

    def close(self) -> None:
        """Close this process's handles (they reopen on the next read)."""
        self.handles.close_all()
        self.pinned.close_all()


class FileReader(ReaderBase):
    """Records as byte ranges of files: shards mapped once per process (sliced), per-sample
    files read with ``pread`` through a bounded cache of descriptors (``max_open_files``,
    default 256), advised random so a clip reads only its records' pages."""

    SAMPLE_SUFFIX = ""

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        records: np.ndarray,
        max_open_files: int | None = None,
        readahead: bool | None = None,
    ) -> None:
        super().__init__(root, manifest, records, max_open_files)
        data_bytes = sum(s.bytes for s in manifest.shards)
        self.readahead = shard_readahead(readahead, self.kind, data_bytes, memory_available())

    def read_exactly(self) -> None:
        """Map shards advised random (``MADV_RANDOM``): only the pages touched are read."""
        self.readahead = EXACT

    def _reads_ahead(self) -> bool:
        return self.readahead == WHOLE

    def sample_path(self, sample: int) -> Path:
        """The per-sample file of sample ``sample``."""
        return self.root / (self.keys[sample] + self.SAMPLE_SUFFIX)

    def _mapped(self, file: int) -> memoryview:
        name = self.shard_names[file]
        opener = lambda: MappedFile(  # noqa: E731
            self.folder(), name, self.shard_id(file), self.readahead
        )
        return self.handles.get(file, opener).view

    def _open(self, file: int) -> OpenFile:
        name = self.keys[file] + self.SAMPLE_SUFFIX
        return self.handles.get(file, lambda: OpenFile(self.folder(), name))

    def _read_file(self, part: FilePart) -> list[bytes]:
        if self.layout == "per-sample":
            return read_ranges(self._open(part.file), part.starts, part.lengths)
        view = self._mapped(part.file)
        return [bytes(view[a : a + n]) for a, n in zip(part.starts, part.lengths)]

    def _read_file_into(self, part: FilePart, out: memoryview, where: list[int]) -> None:
        if self.layout == "per-sample":
            read_ranges_into(self._open(part.file), part.starts, part.lengths, out, where)
            return
        view = self._mapped(part.file)
        for a, n, w in zip(part.starts, part.lengths, where):
            out[w : w + n] = view[a : a + n]
