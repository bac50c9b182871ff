"""NPY: flat uint8 shards of records, or one zero-padded ``(frames, max bytes)`` array per video.

Layout ``"shards"`` (images): ``shard-NNNNN.npy``, each a valid 1-D uint8 ``.npy`` file
(``np.load(path, mmap_mode="r")`` opens it) whose header is padded to HEADER_BYTES, so the data
starts at byte 128; records lie back to back. Readers map each shard once per process.

Layout ``"per-sample"`` (video, the mission's per-video padded NPY): ``<class>/<video>.npy``, a
plain ``(frames, max_frame_bytes)`` uint8 array; row ``j`` is frame ``j`` then zeros up to the
video's largest frame. ``records.npy`` holds each frame's true length and its byte offset in the
file (header parsed at write time, never at read time), so a clip reads exactly its frames'
bytes with ``pread`` through a bounded per-process cache of descriptors.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npformat

from packer.core.manifest import ShardInfo, shard_name
from packer.errors import FormatError
from packer.formats.base import FileReader
from packer.formats.writer import WriterBase

__all__ = ["HEADER_BYTES", "NAME", "Reader", "Writer", "npy_header", "padded"]

NAME = "npy"
SUFFIXES = (".npy",)
SHARD_SUFFIX = ".npy"
LAYOUTS = ("shards", "per-sample")
OFFSETS = "bytes"  # records.npy offsets are byte offsets in the file
TRANSCODE = None
HEADER_BYTES = 128


def npy_header(num_bytes: int) -> bytes:
    """A version-1.0 ``.npy`` header for a 1-D uint8 array, padded to HEADER_BYTES."""
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({num_bytes},), }}"
    pad = HEADER_BYTES - 10 - len(text) - 1
    if pad < 0:
        raise FormatError(f"shard of {num_bytes} bytes does not fit a {HEADER_BYTES}-byte header")
    body = (text + " " * pad + "\n").encode("latin1")
    return b"\x93NUMPY\x01\x00" + len(body).to_bytes(2, "little") + body


def padded(records: Sequence[bytes]) -> np.ndarray:
    """The ``(records, max_record_bytes)`` uint8 array of zero-padded rows."""
    width = max(len(r) for r in records)
    rows = np.zeros((len(records), width), dtype=np.uint8)
    for row, record in zip(rows, records):
        row[: len(record)] = np.frombuffer(record, dtype=np.uint8)
    return rows


class Writer(WriterBase):
    """Write records into flat shards, or one padded array per sample; a context manager."""

    SHARD_SUFFIX = SHARD_SUFFIX

    def _fresh(self) -> None:
        self._file: BinaryIO | None = None
        self._count = 0
        self._size = 0

    def _discard(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _open_shard(self, shard: int) -> None:
        path = self.root / shard_name(shard, SHARD_SUFFIX)
        self._file = open(path, "wb")  # noqa: SIM115
        self._file.write(npy_header(0))
        self._count, self._size = 0, 0

    def write(self, shard: int, key: str, records: Sequence[bytes]) -> list[int]:
        """Append one sample's records; return each record's byte offset in its file."""
        if self.per_sample:
            rows = padded(records)
            header = io.BytesIO()
            npformat.write_array_header_1_0(
                header, {"descr": "|u1", "fortran_order": False, "shape": rows.shape}
            )
            start = header.tell()
            self.files.write(
                self.root / (key + Reader.SAMPLE_SUFFIX),
                [header.getvalue(), rows.tobytes()],
            )
            return [start + j * rows.shape[1] for j in range(len(records))]
        self._roll(shard)
        assert self._file is not None
        offsets = []
        for record in records:
            offsets.append(HEADER_BYTES + self._size)
            self._file.write(record)
            self._size += len(record)
        self._count += len(records)
        return offsets

    def finish_shard(self) -> ShardInfo | None:
        """Close the open shard (if any) durably and return its entry; sync per-sample files."""
        if self._file is None:
            self.files.sync_folders()
            return None
        self._file.seek(0)
        self._file.write(npy_header(self._size))
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        self.files.added(self._shard_path())
        self.files.sync_folders()
        return self._shard_entry(self._count)


class Reader(FileReader):
    """Read records from mapped NPY shards, or by ``pread`` from per-sample padded arrays."""

    SAMPLE_SUFFIX = ".npy"
