"""Video kind: frame folders and video files packed per video, read as sampled clips.

- :func:`detect_kind` tells ``<class>/<image>`` trees from ``<class>/<video>/...`` trees;
- :func:`convert_video` packs a video tree (``packer.convert`` with ``kind="video"``);
- :func:`open_video_dataset` and the ``*VideoDataset`` classes read clips back;
- :func:`run_video_demo` generates a frame tree, converts it and times clip reading.

The on-disk layout is the storage core's (:mod:`packer.manifest`, :mod:`packer.formats`): a
video is a sample whose records are its frames. Names are
imported on first use, so ``packer.convert`` may import ``packer.video.sources`` at its top
without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BMPVideoDataset": "packer.video.datasets",
    "HDF5VideoDataset": "packer.video.datasets",
    "LMDBVideoDataset": "packer.video.datasets",
    "NPYVideoDataset": "packer.video.datasets",
    "NpyVideoDataset": "packer.video.datasets",
    "FolderVideoDataset": "packer.video.datasets",
    "VideoDataset": "packer.video.datasets",
    "VideoFolderDataset": "packer.video.datasets",
    "open_video_dataset": "packer.video.datasets",
    "convert_video": "packer.convert",
    "detect_kind": "packer.detect",
    "scan_videos": "packer.video.sources",
    "make_video_files": "packer.tools.video_demo",
    "make_video_tree": "packer.tools.video_demo",
    "run_video_demo": "packer.tools.video_demo",
    "describe_video": "packer.video.inspect",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'packer.video' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
