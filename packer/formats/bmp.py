"""BMP layout: a decoded tree ``<class>/<name>.bmp`` mirroring the source, 24-bit RGB, no shards.

Reading costs no decode: the reader maps the pixel rows straight out of the file (see
``packer.decode``). It is about 10× the bytes of JPEG. ``index.npy`` has ``shard = -1``,
``length`` = file size; the file of sample ``i`` is ``<key i>.bmp`` (``keys.txt``).
A manifest entry::

    {"format": "bmp", "layout_version": 1, "shards": []}
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from packer.decode import encode_bmp
from packer.errors import FormatError
from packer.formats.common import ReaderBase
from packer.manifest import Manifest, ShardInfo, load_keys
from packer.strings import StringTable

__all__ = ["LAYOUT_VERSION", "NAME", "Reader", "Writer"]

NAME = "bmp"
LAYOUT_VERSION = 1
SHARDED = False
TRANSCODE = encode_bmp  # decode once at conversion time, never at read time
SUFFIX = ".bmp"


def sample_path(root: Path, key: str) -> Path:
    """Where the decoded image of the sample with ``key`` lives."""
    return root / (key + SUFFIX)


class Writer:
    """Write one ``.bmp`` file per sample; a context manager."""

    def __init__(self, root: str | os.PathLike[str], planned_shard_bytes: Sequence[int]) -> None:
        self.root = Path(root)
        self._made: set[Path] = set()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def write(self, shard: int, key: str, label: int, data: bytes) -> tuple[int, int]:
        """Write one decoded sample; return (0, its byte length)."""
        path = sample_path(self.root, key)
        if path.parent not in self._made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._made.add(path.parent)
        with open(path, "wb") as fh:
            fh.write(data)
        return 0, len(data)

    def finish_shard(self) -> ShardInfo | None:
        """Make the files written so far durable (one ``sync`` per planned group of samples)."""
        os.sync()
        return None

    def close(self) -> list[ShardInfo]:
        """Nothing to finish: each sample is its own file (checksums are in the index)."""
        return []


class Reader(ReaderBase):
    """Read samples' bytes from the decoded BMP tree."""

    def __init__(self, root: str | os.PathLike[str], manifest: Manifest, index: np.ndarray) -> None:
        super().__init__(root, manifest, index)
        self.keys = StringTable(load_keys(root))

    def read(self, i: int) -> bytes:
        """The stored bytes (a whole ``.bmp`` file) of sample ``i``."""
        path = sample_path(self.root, self.keys[int(i)])
        try:
            with open(path, "rb") as fh:
                return fh.read()
        except OSError as exc:
            raise FormatError(f"cannot read {str(path)!r}: {exc.strerror}") from exc
