"""Open a packed output for reading: manifest, sample table, record table, the format's reader.

Shared by image and clip datasets and by ``verify``: nothing here opens a data file (readers
open theirs lazily, per process).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import FormatError
from packer.formats import by_name
from packer.formats.base import ReaderBase, shard_identities
from packer.manifest import Manifest, load_index, load_manifest, load_records

__all__ = ["Packed", "open_packed"]


@dataclass
class Packed:
    """A packed output, ready to read: its manifest, sample table columns and reader."""

    root: Path
    manifest: Manifest
    labels: np.ndarray
    counts: np.ndarray
    first: np.ndarray
    reader: ReaderBase


def _folder_id(path: Path) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FormatError(f"cannot open {str(path)!r}: {exc.strerror or exc}") from exc
    return st.st_dev, st.st_ino


def open_packed(
    root: str | os.PathLike[str],
    kind: str | None = None,
    format: str | None = None,
    check_files: bool = True,
    **reader_options: Any,
) -> Packed:
    """Load the manifest and tables of the packed output at ``root`` and make its reader.

    Args:
        kind: refuse an output of another kind (``"image"`` or ``"video"``).
        format: refuse an output of another format (the dataset classes pin one).
        check_files: refuse shards that are missing or of the wrong size (``verify`` reports
            them instead).
        reader_options: passed to the format's reader (``readahead``, ``max_open_files``).

    Raises:
        FormatError: not a complete packer output, another kind or format, or damaged tables.
    """
    path = Path(root)
    before = _folder_id(path)
    manifest = load_manifest(path)
    if format and manifest.format != format:
        raise FormatError(
            f"{str(path)!r} holds format {manifest.format!r}, not {format!r}; "
            "use packer.open_dataset() to pick the right class"
        )
    if kind and manifest.kind != kind:
        raise FormatError(f"{str(path)!r} holds {manifest.kind}s, not {kind}s")
    index = load_index(path, manifest)
    records = load_records(path, index)
    reader = by_name(manifest.format).Reader(path, manifest, records, **reader_options)
    if check_files:
        shards = shard_identities(path, manifest)
        if _folder_id(path) != before:
            raise FormatError(f"{str(path)!r} was replaced while it was being opened; try again")
        reader.pin(before, shards)
    return Packed(
        path,
        manifest,
        np.ascontiguousarray(index["label"], dtype=np.int64),
        np.ascontiguousarray(index["count"], dtype=np.int64),
        np.ascontiguousarray(index["first"], dtype=np.int64),
        reader,
    )
