"""A table file of a dataset (``index.npy``, ``records.npy``, ``keys.txt``), loaded once from
the dataset folder's descriptor and checked against the manifest's xxh3 before any row is used.

The bytes hashed are the bytes used: the file is opened once (``packer.core.contained``: no link at
any level, never a FIFO), mapped (or read), hashed, and its ``.npy`` header parsed from that same
buffer. Measured cost: see ``benchmarks/table_hash.py``.
"""

from __future__ import annotations

import io
import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from numpy.lib import format as npformat

from packer.core.contained import Identity, fstat_identity, open_beneath, open_folder
from packer.errors import FormatError

__all__ = ["check_digest", "check_runs", "fd_checksum", "parse_table", "read_checked", "temp_name"]

_CHUNK = 1 << 20  # as manifest.file_checksum: 1 MiB reads


def temp_name(name: str) -> str:
    """The name a table or the manifest is written under before its rename into place
    (``index.tmp.npy``, ``keys.txt.tmp``, ``packer.json.tmp``)."""
    return name[:-4] + ".tmp.npy" if name.endswith(".npy") else name + ".tmp"


def fd_checksum(fd: int) -> str:
    """xxh3_64 hex digest of the whole file behind ``fd``, read from its start in chunks (a
    shard may be larger than memory; no map, so no page fault can kill the process)."""
    digest = xxhash.xxh3_64()
    position = 0
    while block := os.pread(fd, _CHUNK, position):
        digest.update(block)
        position += len(block)
    return digest.hexdigest()


def _table_buffer(fd: int, mmap_it: bool) -> Any:
    """The whole file behind ``fd``: mapped read-only (shared pages, no copy), or read into a
    writable buffer (an empty file cannot be mapped: it is read)."""
    size = os.fstat(fd).st_size
    if mmap_it and size:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    buf = bytearray(size)
    got = os.preadv(fd, [buf], 0) if size else 0
    if got != size:
        raise OSError(f"read {got} of {size} bytes")
    return buf


def read_checked(
    root: Path, name: str, digest: str | None, mmap_it: bool, dir_fd: int | None = None
) -> tuple[Any, Identity]:
    """The bytes of ``root/name`` (a table) and the file's identity, opened with no link at any
    level beneath the dataset folder (``dir_fd``, else ``root`` opened now) and never a FIFO,
    checked against the manifest's ``digest`` (xxh3_64 of the very bytes returned).

    Raises:
        FormatError: missing, a link, not a regular file, unreadable, or a checksum mismatch.
    """
    folder = open_folder(root) if dir_fd is None else dir_fd
    try:
        fd = open_beneath(folder, name, root)
        try:
            ident = fstat_identity(fd)
            buf = _table_buffer(fd, mmap_it)
        except (OSError, ValueError) as exc:
            raise FormatError(f"cannot read {str(root / name)!r}: {exc}") from exc
        finally:
            os.close(fd)
    finally:
        if dir_fd is None:
            os.close(folder)
    if digest is not None:
        check_digest(buf, digest, str(root / name))
    return buf, ident


def check_digest(buf: Any, digest: str, where: str) -> None:
    """``buf`` (a table's bytes, read from ``where``) hashes to the manifest's ``digest``.

    Raises:
        FormatError: it does not.
    """
    if xxhash.xxh3_64_hexdigest(buf) != digest:
        raise FormatError(
            f"{where!r} differs from the checksum its manifest records (damaged or "
            "modified since the conversion); refusing to read it. Convert the source again"
        )


def parse_table(buf: Any, path: Path | str, dtype: np.dtype, what: str) -> np.ndarray:
    """The 1-D ``dtype`` array a ``.npy`` file's bytes ``buf`` hold, as a view of ``buf`` (no
    copy: a mapped table stays shared).

    Raises:
        FormatError: a damaged header, another dtype or shape, or fewer bytes than its rows.
    """
    try:
        head = io.BytesIO(bytes(memoryview(buf)[: 1 << 16]))
        version = npformat.read_magic(head)
        if version == (1, 0):
            shape, _, found = npformat.read_array_header_1_0(head)
        else:
            shape, _, found = npformat.read_array_header_2_0(head)
        start = head.tell()
    except Exception as exc:  # numpy raises ValueError, SyntaxError, ... on a damaged header
        raise FormatError(
            f"cannot read {what} {str(path)!r}: not a valid .npy file ({exc}); convert again"
        ) from exc
    if found != dtype or len(shape) != 1:
        raise FormatError(
            f"{what} {str(path)!r} has dtype {found} and shape {shape}; expected a 1-D table of "
            f"{dtype}"
        )
    if start + shape[0] * dtype.itemsize > len(buf):
        raise FormatError(f"{what} {str(path)!r} is truncated: its {shape[0]} rows do not fit")
    return np.frombuffer(buf, dtype=dtype, count=shape[0], offset=start)


def check_runs(path: str, index: np.ndarray, records: np.ndarray) -> None:
    """The samples' runs of records (``index``) tile ``records`` (read from ``path``) exactly.

    Raises:
        FormatError: they do not.
    """
    total = 0
    for a in range(0, len(index), 1 << 16):  # in blocks: a few MB of temporaries at any size
        counts = index["count"][a : a + (1 << 16)].astype(np.int64)
        ends = total + np.cumsum(counts)
        if (counts < 1).any() or not np.array_equal(
            index["first"][a : a + len(counts)], ends - counts
        ):
            total = -1
            break
        total = int(ends[-1])
    if total != len(records):
        raise FormatError(
            f"record table {path!r} ({len(records)} rows) does not match the samples of "
            "index.npy: the dataset is corrupt, convert again"
        )
