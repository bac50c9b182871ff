"""What every format's reader shares: index columns, shard paths, a per-process handle cache."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import FormatError
from packer.handles import HandleCache
from packer.manifest import Manifest

__all__ = ["ReaderBase", "SliceReader", "check_shard_files"]


def check_shard_files(root: Path, manifest: Manifest) -> None:
    """Raise FormatError if a shard named by the manifest is missing or has the wrong size."""
    for shard in manifest.shards:
        path = root / shard.name
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise FormatError(
                f"shard {str(path)!r} of {str(root)!r} cannot be opened: {exc.strerror}"
            ) from exc
        if size != shard.bytes:
            raise FormatError(
                f"shard {str(path)!r} has {size} bytes but the manifest records {shard.bytes}: "
                "it is truncated or was modified; convert again"
            )


class ReaderBase:
    """Picklable state shared by all readers: the root, the index columns, a handle cache."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        index: np.ndarray,
        cache: HandleCache | None = None,
    ) -> None:
        self.root = Path(root)
        self.shard_names = [s.name for s in manifest.shards]
        self.shard = np.ascontiguousarray(index["shard"])
        self.offset = np.ascontiguousarray(index["offset"])
        self.length = np.ascontiguousarray(index["length"])
        self.handles = cache if cache is not None else HandleCache(capacity=4096)

    def __len__(self) -> int:
        return len(self.length)

    def read(self, i: int) -> bytes:
        """The stored bytes of sample ``i``."""
        raise NotImplementedError

    def read_many(self, indices: Sequence[int]) -> list[bytes]:
        """The stored bytes of several samples, in the order asked."""
        return [self.read(i) for i in indices]

    def close(self) -> None:
        """Close this process's handles (they reopen on the next read)."""
        self.handles.close_all()


class SliceReader(ReaderBase):
    """A reader whose shards are flat byte buffers: a sample is ``view[offset:offset+length]``.

    Subclasses implement ``_view(shard)``, returning this process's buffer of one shard.
    """

    def _view(self, shard: int) -> Any:
        raise NotImplementedError

    def read(self, i: int) -> bytes:
        """The stored bytes of sample ``i``."""
        start = int(self.offset[i])
        return bytes(self._view(int(self.shard[i]))[start : start + int(self.length[i])])

    def read_many(self, indices: Sequence[int]) -> list[bytes]:
        """Several samples: one buffer lookup per shard, then plain slice copies."""
        idx = np.asarray(indices, dtype=np.int64)
        shards = self.shard[idx]
        starts = self.offset[idx].tolist()
        stops = (self.offset[idx] + self.length[idx]).tolist()
        if len(shards) and (shards == shards[0]).all():
            view = self._view(int(shards[0]))
            return [bytes(view[a:b]) for a, b in zip(starts, stops)]
        views = {int(s): self._view(int(s)) for s in np.unique(shards)}
        return [bytes(views[s][a:b]) for s, a, b in zip(shards.tolist(), starts, stops)]
