"""LMDB video layout: shards ``shard-NNNNN.mdb``, one record per frame, so a clip touches only its frames.

The record key is the frame's global number (its row in ``frames.npy``) as 8 big-endian bytes;
the value is the encoded frame. A video's frames are consecutive records of one shard (``index.npy``: ``shard``, ``offset`` = first frame). Shards
roll past ``shard_size`` bytes at a video boundary; each video is written in one transaction
(the map grows on ``MapFullError``). A manifest entry::

    {"format": "lmdb", "kind": "video", "layout_version": 1,
     "shards": [{"name": "shard-00000.mdb", "samples": 95000, "bytes": 1073872896, "xxh3_64": "..."}]}

(``samples`` counts frames.) Readers share one environment and read transaction per shard per
process (``packer.formats.lmdb``) and fetch a clip with one ``getmulti``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lmdb
import numpy as np

from packer.errors import FormatError
from packer.formats import lmdb as core
from packer.manifest import Manifest, ShardInfo, file_checksum, shard_name
from packer.video.common import VideoReaderBase

__all__ = ["NAME", "Reader", "Writer"]

NAME = "lmdb"
SUFFIX = ".mdb"
SHARDED = True
TRANSCODE = None


def _map_size(planned_bytes: int) -> int:
    # Frames above ~2 KB go to overflow pages: at most one extra page each, plus B-tree pages.
    return planned_bytes + planned_bytes // 2 + (16 << 20)


def record_key(frame: int) -> bytes:
    """The LMDB key of the frame whose global number (row in ``frames.npy``) is ``frame``."""
    return frame.to_bytes(8, "big")


class Writer:
    """Write every frame as one record, videos kept whole within a shard; a context manager."""

    def __init__(self, root: str | os.PathLike[str], shard_size: int) -> None:
        self.root = Path(root)
        self.shard_size = shard_size
        self.shards: list[ShardInfo] = []
        self.data_bytes = 0
        self._env: Any = None
        self._shard = -1
        self._shard_bytes = 0
        self._count = 0
        self._frame = 0

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self._env is not None:
            self._env.close()
            self._env = None

    def _open_shard(self, size: int) -> None:
        self._finish_shard()
        self._shard += 1
        self._shard_bytes = self._count = 0
        self._env = lmdb.open(
            str(self.root / shard_name(self._shard, SUFFIX)),
            subdir=False,
            lock=False,
            map_size=_map_size(max(self.shard_size, size)),
            sync=False,
            metasync=False,
            readahead=False,
            meminit=True,
        )

    def write(self, key: str, label: int, frames: list[bytes]) -> int:
        """Append one video's frames in one transaction; return its shard."""
        size = sum(len(f) for f in frames)
        if self._env is None or (self._shard_bytes and self._shard_bytes + size > self.shard_size):
            self._open_shard(size)
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for j, frame in enumerate(frames):
                        txn.put(record_key(self._frame + j), frame, append=True)
                break
            except lmdb.MapFullError:  # the aborted transaction left nothing: grow and redo
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        self._frame += len(frames)
        self._count += len(frames)
        self._shard_bytes += size
        return self._shard

    def _finish_shard(self) -> None:
        if self._env is None:
            return
        self._env.sync(True)
        self._env.close()
        self._env = None
        path = self.root / shard_name(self._shard, SUFFIX)
        size = path.stat().st_size
        self.shards.append(ShardInfo(path.name, self._count, size, file_checksum(path)))
        self.data_bytes += size

    def close(self) -> list[ShardInfo]:
        """Sync and close the last shard; return every shard's entry (``samples`` = frames)."""
        self._finish_shard()
        return self.shards


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
        return self.handles.get(shard, lambda: core._Handle(path, self.readahead))

    def read(self, video: int, frames: np.ndarray) -> list[bytes]:
        """One ``getmulti`` for the clip's frames (keys ascending, so on-disk order)."""
        first, shard = int(self.first[video]), int(self.shard[video])
        keys = [record_key(first + int(j)) for j in frames]
        pairs = self._handle(shard).cursor.getmulti(keys)
        if len(pairs) != len(keys):
            raise FormatError(
                f"frames of video {self.keys[video]!r} are missing from {self.shard_names[shard]!r}"
            )
        return [bytes(value) for _, value in pairs]
