"""BMP video layout: decoded frames ``<class>/<video>/000000.bmp`` (24-bit RGB), no shards.

Frame ``j`` of a video is ``<key>/<j:06d>.bmp`` (numbered from 0 whatever the source names).
Reading costs no decode (``packer.decode`` maps the pixel rows from the bytes); it is about
10× the bytes of JPEG. Frames from video files are the same pixels the other formats store
(decoded from the re-encoded JPEG), so every format returns the same clip.
"""

from __future__ import annotations

import numpy as np

from packer.decode import encode_bmp
from packer.errors import FormatError
from packer.video.common import PerVideoWriter, VideoReaderBase, video_file
from packer.video.layout import frame_path_name

__all__ = ["NAME", "Reader", "Writer"]

NAME = "bmp"
SUFFIX = ".bmp"
SHARDED = False
TRANSCODE = encode_bmp


class Writer(PerVideoWriter):
    """Write one folder of ``.bmp`` frames per video; a context manager."""

    def write(self, key: str, label: int, frames: list[bytes]) -> int:
        """Write one video's decoded frames; return its shard (-1: files of its own)."""
        folder = video_file(self.root, key, "")
        folder.mkdir(parents=True, exist_ok=True)
        for number, frame in enumerate(frames):
            (folder / frame_path_name(number, SUFFIX)).write_bytes(frame)
            self.data_bytes += len(frame)
        return -1


class Reader(VideoReaderBase):
    """Read sampled frames' ``.bmp`` files."""

    def read(self, video: int, frames: np.ndarray) -> list[bytes]:
        """Read each sampled frame's file."""
        folder = video_file(self.root, self.keys[video], "")
        out = []
        for number in frames:
            path = folder / frame_path_name(int(number), SUFFIX)
            try:
                out.append(path.read_bytes())
            except OSError as exc:
                raise FormatError(f"cannot read {str(path)!r}: {exc.strerror}") from exc
        return out
