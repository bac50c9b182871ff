"""The format registry: a destination suffix (or a name) maps to the module storing records.

Each entry meets the contracts of :mod:`packer.formats.base` (a ``Writer`` and a ``Reader``
over records, where an image is one record and a video one record per frame). A new format is
one module plus one line in ``_MODULES``.
"""

from __future__ import annotations

import os
from types import ModuleType

from packer.core.manifest import shard_name
from packer.errors import DestinationError, FormatError
from packer.formats import bmp, hdf5, lmdb, npy

__all__ = ["FORMATS", "by_name", "default_layout", "format_for", "shard_name"]

_MODULES: tuple[ModuleType, ...] = (bmp, hdf5, lmdb, npy)

FORMATS: dict[str, ModuleType] = {suffix: m for m in _MODULES for suffix in m.SUFFIXES}

_BY_NAME: dict[str, ModuleType] = {m.NAME: m for m in _MODULES}


def format_for(path: str | os.PathLike[str]) -> ModuleType:
    """The format module for a destination path, chosen by its suffix.

    Raises:
        DestinationError: the suffix is not a known format (the message lists the valid ones).
    """
    name = os.path.basename(os.fspath(path).rstrip("/"))
    suffix = os.path.splitext(name)[1].lower()
    if suffix not in FORMATS:
        expected = ", ".join(sorted(FORMATS))
        if suffix:
            raise DestinationError(
                f"unknown destination suffix {suffix!r} in {os.fspath(path)!r}; expected one "
                f"of {expected} (or pass --format)"
            )
        raise DestinationError(
            f"destination {os.fspath(path)!r} has no suffix to tell the format by; name it "
            f"with one of {expected} (e.g. {name or 'out'}.lmdb) or pass --format"
        )
    return FORMATS[suffix]


def by_name(name: str) -> ModuleType:
    """The format module called ``name`` (``lmdb``, ``hdf5``, ``npy``, ``bmp``)."""
    if name not in _BY_NAME:
        raise FormatError(f"unknown format {name!r}; expected one of {', '.join(sorted(_BY_NAME))}")
    return _BY_NAME[name]


def default_layout(module: ModuleType, kind: str) -> str:
    """The layout a format writes for a kind: per-sample files for video where it has them
    (the per-video NPY and HDF5 layouts), shards otherwise."""
    layouts: tuple[str, ...] = module.LAYOUTS
    if kind == "video" and "per-sample" in layouts:
        return "per-sample"
    return "shards" if "shards" in layouts else layouts[0]
