"""Video kind: frame folders and video files packed per video, read as sampled clips.

- :func:`detect_kind` tells ``<class>/<image>`` trees from ``<class>/<video>/...`` trees;
- :func:`convert_video` packs a video tree (``packer.convert`` with ``kind="video"``);
- :func:`open_video_dataset` and the ``*VideoDataset`` classes read clips back;
- :func:`run_video_demo` generates a frame tree, converts it and times clip reading.

The on-disk layout is the storage core's (:mod:`packer.core.manifest`, :mod:`packer.formats`): a
video is a sample whose records are its frames. Names are
imported on first use, so ``packer.convert`` may import ``packer.source.videos`` at its top
without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BMPVideoDataset": "packer.read.video_datasets",
    "HDF5VideoDataset": "packer.read.video_datasets",
    "LMDBVideoDataset": "packer.read.video_datasets",
    "NPYVideoDataset": "packer.read.video_datasets",
    "NpyVideoDataset": "packer.read.video_datasets",
    "FolderVideoDataset": "packer.read.video_datasets",
    "VideoDataset": "packer.read.video_datasets",
    "VideoFolderDataset": "packer.read.video_datasets",
    "open_video_dataset": "packer.read.open",
    "convert_video": "packer.convert",
    "detect_kind": "packer.source.detect",
    "scan_videos": "packer.source.videos",
    "make_video_files": "packer.demo.video",
    "make_video_tree": "packer.demo.video",
    "run_video_demo": "packer.demo.video",
    "describe_video": "packer.read.describe_video",
}

__all__ = sorted(set(_EXPORTS) - {"NpyVideoDataset", "VideoFolderDataset"})  # old names


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'packer.video' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
