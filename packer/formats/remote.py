"""Records as byte ranges of objects at a URL: the remote reader of the byte-range formats
(NPY and HDF5, shards and per-sample files).

A request's records are grouped by file and sorted by offset, nearby ones coalesced into one
ranged GET (``packer.storage.GAP``), and every run of the request is in flight at once
(fsspec's ``cat_ranges``). Picklable: the URL, the options and the tables; each process opens
its own client (``packer.storage.RemoteFolder``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from packer.formats.base import ReaderBase
from packer.keytable import KeyTable
from packer.manifest import Manifest
from packer.storage import GAP, RemoteFolder, coalesce

__all__ = ["HeldKeys", "RemoteReader"]


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
    """Read records of an NPY or HDF5 output at a URL by ranged GETs.

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

    def file_name(self, file: int) -> str:
        """The name of data file ``file`` in the folder (a shard, or a sample's file)."""
        if self.layout == "per-sample":
            return self.keys[file] + self.sample_suffix
        return self.shard_names[file]

    def read_many(self, records: Sequence[int] | np.ndarray) -> list[bytes]:
        """The stored bytes of each record, in the order asked: one request per coalesced run,
        all runs of the call in flight together."""
        rec = np.asarray(records, dtype=np.int64)
        out: list[bytes] = [b""] * len(rec)
        names: list[str] = []
        starts: list[int] = []
        stops: list[int] = []
        pieces: list[tuple[int, list[int], list[int], list[int]]] = []
        for file, where in self._groups(rec):
            chosen = rec[where]
            offsets = self.offset[chosen].tolist()
            lengths = self.length[chosen].tolist()
            name = self.file_name(file)
            for start, stop, first, last in coalesce(offsets, lengths, self.gap):
                names.append(name)
                starts.append(start)
                stops.append(stop)
                positions = where[first:last].tolist()
                pieces.append((start, positions, offsets[first:last], lengths[first:last]))
        if not names:
            return out
        blocks = self.remote.read_runs(names, starts, stops)
        for block, (start, positions, offsets, lengths) in zip(blocks, pieces):
            view = memoryview(block)
            for j, a, n in zip(positions, offsets, lengths):
                out[j] = bytes(view[a - start : a - start + n])
        return out

    def read_into(
        self,
        records: Sequence[int] | np.ndarray,
        out: memoryview,
        where: Sequence[int] | np.ndarray,
    ) -> None:
        """Copy record ``records[k]`` into ``out[where[k]:where[k]+length]``."""
        for w, data in zip(np.asarray(where, dtype=np.int64).tolist(), self.read_many(records)):
            out[w : w + len(data)] = data
