"""The video format registry: core format name -> the module writing and reading its video layout."""

from __future__ import annotations

from types import ModuleType

from packer.errors import FormatError
from packer.video import bmp, hdf5, lmdb, npy

__all__ = ["VIDEO_FORMATS", "video_format"]

VIDEO_FORMATS: dict[str, ModuleType] = {m.NAME: m for m in (bmp, hdf5, lmdb, npy)}


def video_format(name: str) -> ModuleType:
    """The video module for format ``name`` (``lmdb``, ``hdf5``, ``npy``, ``bmp``)."""
    if name not in VIDEO_FORMATS:
        raise FormatError(
            f"unknown video format {name!r}; expected one of {', '.join(sorted(VIDEO_FORMATS))}"
        )
    return VIDEO_FORMATS[name]
