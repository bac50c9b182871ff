"""The format registry: a destination suffix maps to the module that writes and reads it.

Each format module declares, side by side, its on-disk layout, its ``Writer`` (a context
manager) and its low-level ``Reader`` (picklable; handles open lazily per process):

- ``NAME``, ``LAYOUT_VERSION``, ``SHARDED`` (data in shard files, or one file per sample),
  ``TRANSCODE`` (None to copy the encoded bytes unchanged, or a function bytes -> bytes).
- ``Writer(root, planned_shard_bytes)`` with ``write(shard, key, label, data) -> (offset, length)`` and
  ``close() -> list[ShardInfo]``.
- ``Reader(root, manifest, index, **options)`` with ``read(i) -> bytes`` and
  ``read_many(indices) -> list[bytes]``.
"""

from __future__ import annotations

import os
from types import ModuleType

from packer.errors import DestinationError, FormatError
from packer.formats import bmp, hdf5, lmdb, npy
from packer.manifest import shard_name

__all__ = ["FORMATS", "by_name", "format_for", "shard_name"]

FORMATS: dict[str, ModuleType] = {
    ".bmp": bmp,
    ".h5": hdf5,
    ".hdf5": hdf5,
    ".lmdb": lmdb,
    ".npy": npy,
}

_BY_NAME: dict[str, ModuleType] = {m.NAME: m for m in FORMATS.values()}


def format_for(path: str | os.PathLike[str]) -> ModuleType:
    """The format module for a destination path, chosen by its suffix.

    Raises:
        DestinationError: the suffix is not a known format (the message lists the valid ones).
    """
    suffix = os.path.splitext(os.fspath(path).rstrip("/"))[1].lower()
    if suffix not in FORMATS:
        shown = repr(suffix) if suffix else "no suffix"
        raise DestinationError(
            f"unknown destination suffix {shown} in {os.fspath(path)!r}; expected one of "
            f"{', '.join(sorted(FORMATS))} (or pass --format)"
        )
    return FORMATS[suffix]


def by_name(name: str) -> ModuleType:
    """The format module called ``name`` (``lmdb``, ``hdf5``, ``npy``, ``bmp``)."""
    if name not in _BY_NAME:
        raise FormatError(f"unknown format {name!r}; expected one of {', '.join(sorted(_BY_NAME))}")
    return _BY_NAME[name]
