"""NPY layout: shards ``shard-NNNNN.npy``, each one flat 1-D uint8 array of encoded samples.

Each shard is a valid ``.npy`` file (``np.load(path, mmap_mode="r")`` opens it) whose header is
padded to a fixed 128 bytes, so the data starts at byte 128. A sample is the slice
``[offset, offset + length)`` of its shard (``index.npy``). A manifest entry::

    {"format": "npy", "layout_version": 1,
     "shards": [{"name": "shard-00000.npy", "samples": 12000, "bytes": 1073741952, "xxh3_64": "..."}]}

Reading memory-maps each shard once per process and copies out only the sampled slices.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from packer.errors import FormatError
from packer.formats.common import SliceReader
from packer.manifest import Manifest, ShardInfo, file_checksum, shard_name

__all__ = ["HEADER_BYTES", "LAYOUT_VERSION", "NAME", "MappedArray", "Reader", "Writer"]

NAME = "npy"
LAYOUT_VERSION = 1
SHARDED = True
TRANSCODE = None
SUFFIX = ".npy"
HEADER_BYTES = 128


def npy_header(num_bytes: int) -> bytes:
    """A version-1.0 ``.npy`` header for a 1-D uint8 array, padded to HEADER_BYTES."""
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({num_bytes},), }}"
    pad = HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise FormatError(f"shard of {num_bytes} bytes does not fit a {HEADER_BYTES}-byte header")
    body = (text + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


class Writer:
    """Write samples into flat ``.npy`` shards, in order; a context manager."""

    def __init__(self, root: str | os.PathLike[str], planned_shard_bytes: Sequence[int]) -> None:
        self.root = Path(root)
        self.shards: list[ShardInfo] = []
        self._file: BinaryIO | None = None
        self._current = -1
        self._count = 0
        self._size = 0

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self._file is not None:
            self._file.close()

    def write(self, shard: int, key: str, label: int, data: bytes) -> tuple[int, int]:
        """Append one sample to ``shard``; return its (byte offset in the data, length)."""
        if shard != self._current:
            self.finish_shard()
            self._file = open(self.root / shard_name(shard, SUFFIX), "wb")  # noqa: SIM115
            self._file.write(npy_header(0))
            self._current, self._count, self._size = shard, 0, 0
        assert self._file is not None
        self._file.write(data)
        offset = self._size
        self._size += len(data)
        self._count += 1
        return offset, len(data)

    def finish_shard(self) -> ShardInfo | None:
        """Close the open shard (if any), fsync it and return its manifest entry."""
        if self._file is None:
            return None
        self._file.seek(0)
        self._file.write(npy_header(self._size))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        path = self.root / shard_name(self._current, SUFFIX)
        self.shards.append(
            ShardInfo(path.name, self._count, path.stat().st_size, file_checksum(path))
        )
        return self.shards[-1]

    def close(self) -> list[ShardInfo]:
        """Finish the last shard; return every shard's entry."""
        self.finish_shard()
        return self.shards


class MappedArray:
    """A read-only memory map of one ``.npy`` file, closable (a HandleCache entry)."""

    def __init__(self, path: Path) -> None:
        try:
            self.array: Any = np.load(path, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise FormatError(f"cannot open {str(path)!r}: {exc}") from exc
        self.view = memoryview(self.array.data).cast("B") if self.array.ndim == 1 else None

    def close(self) -> None:
        mm = getattr(self.array, "_mmap", None)
        if self.view is not None:
            try:
                self.view.release()
            except BufferError:
                pass
        self.array = self.view = None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a slice still references the map: let GC unmap it
                pass


class Reader(SliceReader):
    """Read samples' bytes from memory-mapped NPY shards."""

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest, index: np.ndarray) -> None:
        super().__init__(root, manifest, index)

    def _view(self, shard: int) -> memoryview:
        path = self.root / self.shard_names[shard]
        return self.handles.get(shard, lambda: MappedArray(path)).view
