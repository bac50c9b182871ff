"""What every format's reader shares: index columns, shard paths, a per-process handle cache."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from packer.errors import FormatError
from packer.handles import HandleCache
from packer.manifest import Manifest

__all__ = ["ReaderBase", "check_shard_files"]


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
