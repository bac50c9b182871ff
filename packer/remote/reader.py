"""Reading an output at a URL by ranged GETs (the readers through the node's shard cache are
:mod:`packer.remote.cached_reader`).

:class:`RemoteReader` reads records as byte ranges of objects (NPY and HDF5 shards and
per-sample files): a request's records are grouped by file and sorted by offset, nearby ones
coalesced into one ranged GET (``packer.remote.storage.GAP``), and every run of the request is in
flight at once (fsspec's ``cat_ranges``). BMP records are whole objects (one file each), each
fetched by one GET and checked against the record table's xxh3 before it is served.

A reader is picklable: the URL, the options and the tables; each process opens its own client
(``packer.remote.storage.RemoteFolder``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from packer.core.keytable import KeyTable
from packer.core.manifest import Manifest
from packer.errors import FormatError
from packer.formats.base import ReaderBase, copy_records
from packer.formats.bmp import record_name
from packer.formats.record_check import check_records
from packer.remote import storage
from packer.remote.storage import GAP, RemoteFolder, coalesce

__all__ = ["HeldKeys", "RemoteReader", "check_records"]


class HeldKeys(KeyTable):
    """Keys read from a URL at open: they pickle with their bytes (no file to map again)."""

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["blob"] = np.ascontiguousarray(self._load()[0])  # out of band with protocol 5
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        blob = state["blob"]
        self._blob = np.frombuffer(blob, np.uint8) if len(blob) else np.zeros(0, np.uint8)


class RemoteReader(ReaderBase):
    """Read records of an NPY, HDF5 or BMP output at a URL by ranged GETs, each checked against
    its xxh3 in the record table.

    Args:
        folder: the output's folder (URL and storage options).
        manifest, records: the output's manifest and record table (fetched and checked).
        sample_suffix: the format's per-sample file suffix (``.npy``, ``.h5``).
    """

    RANGED = True

    def __init__(
        self,
        folder: RemoteFolder,
        manifest: Manifest,
        records: np.ndarray,
        sample_suffix: str,
        gap: int = GAP,
        verify: bool = True,
        max_open_files: int | None = None,
    ) -> None:
        super().__init__(folder.url, manifest, records, max_open_files)
        self.url = folder.url
        self.remote = folder
        self.sample_suffix = sample_suffix
        self.gap = gap
        # every record fetched is checked against its xxh3 (a flipped byte on the way is fetched
        # again, never served: ~8 µs for an 80 KB image, nothing beside a request); BMP: a
        # record is a whole file. ``verify=False`` is only for a caller that checks itself.
        self.whole_files = manifest.format == "bmp"
        self.checksum: np.ndarray | None = records["checksum"] if verify else None

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
        for where, (file, _, offsets, lengths) in self._parts(rec):
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

    def _read_many(self, rec: np.ndarray) -> list[bytes]:
        """The stored bytes of each record, in the order asked: one request per coalesced run,
        all runs of the call in flight together (each record checked against its xxh3 when
        the reader checks them)."""
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
        wrong bytes. At the first mismatch, an object whose size or ETag changed since the
        open (replaced, even by one of its size) is refused at once (``check_unchanged``)."""
        assert self.checksum is not None

        def unchanged(bad: list[int]) -> None:  # replaced since the open (its ETag): say so
            for name in dict.fromkeys(self._runs(rec[bad])[0]):
                self.remote.check_unchanged(self.remote.url_of(name))

        def again(bad: list[int], attempt: int) -> list[bytes]:
            if attempt == 1:
                unchanged(bad)
            time.sleep(storage.RETRY.delay(attempt))
            return self._fetch(rec[bad])

        def failed(bad: list[int], attempt: int) -> FormatError:
            if attempt == 1:
                unchanged(bad)
            url = self.remote.url_of(self._runs(rec[bad[:1]])[0][0])
            return FormatError(
                f"{url!r} differs from its checksum in the record table after "
                f"{attempt} reads (record {int(rec[bad[0]])}): it was replaced after the "
                "conversion or is corrupt in the store. Convert and upload the dataset again"
            )

        check_records(self.checksum[rec], out, again, failed, storage.RETRY.attempts)

    def _read_into(self, rec: np.ndarray, out: memoryview, dest: np.ndarray) -> None:
        copy_records(out, dest, self._read_many(rec))
