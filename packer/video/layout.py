"""The video layout shared by all four formats, declared once.

A packed video dataset is a directory (here ``out.npy/``)::

    packer.json   manifest: "kind": "video", "num_samples" = number of videos, written last
    index.npy     packer.manifest.INDEX_DTYPE, one row per video:
                    label    class label
                    shard    LMDB shard number of the video's frames; -1 for the other formats
                    offset   global number of the video's first frame (its row in frames.npy)
                    length   number of frames of the video
                    checksum xxh3_64 of the video's frames, as stored, concatenated in order
    frames.npy    FRAME_DTYPE, one row per frame, videos back to back in index order:
                    length   true byte length of the stored frame (decode never sees padding)
                    checksum xxh3_64 of the stored frame
    keys.txt      one key per video: <class>/<video>
    ...           the format's data (see packer.video.npy, .hdf5, .lmdb, .bmp)

``frames.npy`` is listed in ``manifest.files`` with its checksum, like ``index.npy``. The
manifest's ``options`` hold the conversion options and ``options["storage"]``::

    {"frames": 9537, "frame_bytes": 190000000, "data_bytes": 212000000,
     "padding_overhead": 1.116, "max_frames": 300, "mean_frames": 187.0}

where ``padding_overhead`` is bytes on disk / bytes of frames (1.0 = none; NPY pads every row
to the video's largest frame). Readers keep only the ``length`` column in memory (4 bytes per
frame).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from packer.errors import FormatError
from packer.manifest import Manifest, file_checksum

__all__ = [
    "FRAMES_NAME",
    "FRAME_DTYPE",
    "LAYOUT_VERSION",
    "frame_path_name",
    "load_frames",
    "write_frames",
]

LAYOUT_VERSION = 1
FRAMES_NAME = "frames.npy"
FRAME_DTYPE = np.dtype([("length", "<u4"), ("checksum", "<u8")])


def frame_path_name(number: int, suffix: str) -> str:
    """The file name of frame ``number`` in a per-frame layout: ``000012.bmp``."""
    return f"{number:06d}{suffix}"


def write_frames(root: str | os.PathLike[str], frames: np.ndarray) -> str:
    """Write ``frames.npy`` atomically; return its checksum."""
    path = Path(root) / FRAMES_NAME
    tmp = path.with_name("frames.tmp.npy")
    np.save(tmp, np.ascontiguousarray(frames, dtype=FRAME_DTYPE))
    os.replace(tmp, path)
    return file_checksum(path)


def load_frames(root: str | os.PathLike[str], manifest: Manifest, index: np.ndarray) -> np.ndarray:
    """Load ``frames.npy`` and check it agrees with the index.

    Raises:
        FormatError: missing, unreadable, wrong dtype, or not one row per indexed frame.
    """
    path = Path(root) / FRAMES_NAME
    try:
        frames = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise FormatError(f"cannot read frame table {str(path)!r}: {exc}") from exc
    if frames.dtype != FRAME_DTYPE:
        raise FormatError(
            f"frame table {str(path)!r} has dtype {frames.dtype}; expected {FRAME_DTYPE}"
        )
    expected = int(index["length"].sum()) if len(index) else 0
    if len(frames) != expected:
        raise FormatError(
            f"frame table {str(path)!r} has {len(frames)} rows but the index counts {expected} "
            "frames: the dataset is corrupt, convert again"
        )
    return frames
