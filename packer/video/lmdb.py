"""LMDB video layout: shards ``shard-NNNNN.mdb``, one record per frame, so a clip touches only its frames.

The record key is the frame's global number (its row in ``frames.npy``) as 8 big-endian bytes
(``packer.formats.lmdb.record_key``); the value is the encoded frame. A video's frames are
consecutive records of one shard (``index.npy``: ``shard``, ``offset`` = first frame). Shards
roll past ``shard_size`` bytes at a video boundary. A manifest entry::

    {"format": "lmdb", "kind": "video", "layout_version": 1,
     "shards": [{"name": "shard-00000.mdb", "samples": 95000, "bytes": 1073872896, "xxh3_64": "..."}]}

(``samples`` counts frames.) Readers share one environment and read transaction per shard per
process (``packer.formats.lmdb``) and fetch a clip with one ``getmulti``.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from packer.errors import FormatError
from packer.formats import lmdb as core
from packer.manifest import Manifest, ShardInfo
from packer.video.common import VideoReaderBase

__all__ = ["NAME", "Reader", "Writer"]

NAME = "lmdb"
SUFFIX = ".mdb"
SHARDED = True
TRANSCODE = None


class Writer:
    """Write every frame as one record, videos kept whole within a shard; a context manager."""

    def __init__(self, root: str | os.PathLike[str], shard_size: int) -> None:
        self.shard_size = shard_size
        self._inner = core.Writer(root, [])
        self._shard = -1
        self._shard_bytes = 0
        self.data_bytes = 0

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self._inner.__exit__(*exc)

    def write(self, key: str, label: int, frames: list[bytes]) -> int:
        """Append one video's frames; return its shard."""
        size = sum(len(f) for f in frames)
        if self._shard < 0 or (
            self._shard_bytes > 0 and self._shard_bytes + size > self.shard_size
        ):
            self._shard += 1
            self._shard_bytes = 0
            self._inner.planned.append(max(self.shard_size, size))
        for frame in frames:
            self._inner.write(self._shard, key, label, frame)
        self._shard_bytes += size
        return self._shard

    def close(self) -> list[ShardInfo]:
        """Commit and close the last shard; return every shard's entry."""
        shards = self._inner.close()
        self.data_bytes = sum(s.bytes for s in shards)
        return shards


class Reader(VideoReaderBase):
    """Read sampled frames from LMDB shards.

    Args:
        readahead: let the kernel read ahead around each record (see ``packer.formats.lmdb``).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        manifest: Manifest,
        index: np.ndarray,
        frame_lengths: np.ndarray,
        readahead: bool = True,
    ) -> None:
        super().__init__(root, manifest, index, frame_lengths, max_open_files=4096)
        self.readahead = readahead

    def _handle(self, shard: int) -> core._Handle:
        path = Path(self.root) / self.shard_names[shard]
        return self.handles.get(shard, lambda: core._Handle(path, self.readahead))  # type: ignore[no-any-return]

    def read(self, video: int, frames: np.ndarray) -> list[bytes]:
        """One ``getmulti`` for the clip's frames (keys ascending, so on-disk order)."""
        first, shard = int(self.first[video]), int(self.shard[video])
        keys = [core.record_key(first + int(j)) for j in frames]
        pairs = self._handle(shard).cursor.getmulti(keys)
        if len(pairs) != len(keys):
            raise FormatError(
                f"frames of video {self.keys[video]!r} are missing from {self.shard_names[shard]!r}"
            )
        return [bytes(value) for _, value in pairs]
