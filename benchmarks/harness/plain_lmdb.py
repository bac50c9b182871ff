"""A plain py-lmdb reader of a packer ``.lmdb`` image output: the baseline for packer's LMDB reader.

What a user would write by hand against the same files, with none of packer's machinery (no
handle cache, no shared environments, no record table lookups per batch beyond two arrays):

- each process opens each shard once with ``lmdb.open(readonly=True, lock=False)``, keeps one
  ``buffers=True`` read transaction and one cursor on it;
- a batch is one ``cursor.getmulti`` per shard, the keys being the 8-byte big-endian record
  numbers packer writes (:func:`packer.formats.lmdb.record_key`): sample ``i`` is record
  ``first[i]`` of the record table, in shard ``records["file"][first[i]]``, whose key is its
  position among that shard's records;
- each value is copied out of the map with ``bytes(value)`` (``output="bytes"``) or decoded with
  :func:`packer.decode.outputs.decode` (any other output).

It returns ``(data, label)`` pairs for any collate. Images only (one record per sample).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lmdb
import numpy as np
from torch.utils.data import Dataset

from packer.core.manifest import load_index, load_manifest, load_records
from packer.decode.outputs import check_output, decode
from packer.errors import FormatError

__all__ = ["PlainLMDBDataset"]


class PlainLMDBDataset(Dataset):
    """Samples of a packer ``.lmdb`` image output read with plain py-lmdb calls (see the module).

    Args:
        root: the ``.lmdb`` output folder.
        output: ``"bytes"`` (the stored bytes) or an output :func:`packer.decode.outputs.decode` knows.
        readahead: passed to ``lmdb.open`` (packer's reader uses ``True`` for images too).
    """

    def __init__(
        self, root: str | os.PathLike[str], output: str = "bytes", readahead: bool = True
    ) -> None:
        self.root = Path(root)
        manifest = load_manifest(self.root)
        if manifest.format != "lmdb" or manifest.kind != "image":
            raise FormatError(f"{str(root)!r} is not a packer LMDB image output")
        index = load_index(self.root, manifest)
        records = load_records(self.root, index)
        if (index["count"] != 1).any():
            raise FormatError(f"{str(root)!r} has samples of several records")
        first = index["first"].astype(np.int64)
        files = records["file"].astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(np.bincount(files))[:-1]))
        self.shard = files[first]
        self.number = first - starts[self.shard]
        self.labels = index["label"].astype(np.int64)
        self.paths = [str(self.root / s.name) for s in manifest.shards]
        self.output = check_output(output)
        self.readahead = readahead
        self._pid = 0
        self._open: dict[int, tuple[Any, Any, Any]] = {}  # shard -> (env, txn, cursor)

    def __len__(self) -> int:
        return len(self.labels)

    def _cursor(self, shard: int) -> Any:
        if self._pid != os.getpid():  # a fresh process (or a forked worker): open our own
            self._pid, self._open = os.getpid(), {}
        opened = self._open.get(shard)
        if opened is None:
            env = lmdb.open(
                self.paths[shard],
                subdir=False,
                readonly=True,
                lock=False,
                readahead=self.readahead,
            )
            txn = env.begin(buffers=True)
            opened = self._open[shard] = (env, txn, txn.cursor())
        return opened[2]

    def _values(self, positions: list[int]) -> list[Any]:
        """The stored values (buffers into the map) of samples ``positions``, in that order."""
        shards = self.shard[positions].tolist()
        numbers = self.number[positions].tolist()
        out: list[Any] = [None] * len(positions)
        for shard in sorted(set(shards)):
            where = [k for k, s in enumerate(shards) if s == shard]
            keys = [numbers[k].to_bytes(8, "big") for k in where]
            pairs = self._cursor(shard).getmulti(keys)
            if len(pairs) != len(keys):
                raise FormatError(f"a record is missing from {self.paths[shard]!r}")
            for k, (_, value) in zip(where, pairs):
                out[k] = value
        return out

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, int]]:
        positions = [int(i) for i in indices]
        labels = self.labels[positions].tolist()
        values = self._values(positions)
        if self.output == "bytes":
            return [(bytes(v), y) for v, y in zip(values, labels)]
        return [(decode(bytes(v), self.output), y) for v, y in zip(values, labels)]

    def __getitem__(self, i: int) -> tuple[Any, int]:
        return self.__getitems__([i])[0]

    def close(self) -> None:
        """Close this process's environments (they reopen on the next read)."""
        if self._pid == os.getpid():
            for env, txn, _ in self._open.values():
                txn.abort()
                env.close()
        self._open = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": 0, "_open": {}}
