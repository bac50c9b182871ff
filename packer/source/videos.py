"""Scan a video source tree. Stats files, reads no bytes (kind detection: :mod:`packer.source.detect`).

A video source is ``root/<class>/<video>`` where each video is either

- a **frame folder** ``<video>/`` of image files, ordered naturally (``img_2`` before
  ``img_10``, :func:`packer.source.images.natural_key`), or
- a **video file** ``<video>.mp4`` / ``.avi`` / ``.webm`` / ``.mkv`` (decoded with PyAV).

Classes are the sorted class folder names (torchvision ``ImageFolder`` convention); videos are
sorted by name within a class. A video's key is ``<class>/<video>`` (the file's stem). A frame
folder without frames is skipped and recorded; a tree where some classes hold images directly
and others hold videos is an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import SourceError
from packer.source.detect import class_shape, detect
from packer.source.images import (
    VIDEO_EXTENSIONS,
    SkippedInput,
    is_image_name,
    is_video_name,
    natural_key,
)
from packer.source.links import LOOP, folder_entry, loops_in

__all__ = [
    "KINDS",
    "VIDEO_EXTENSIONS",
    "VideoSample",
    "VideoScan",
    "is_video_name",
    "scan_videos",
]

KINDS = ("image", "video")


@dataclass(frozen=True)
class VideoSample:
    """One video of the source: key, label, path, and its frame files (None for a video file)."""

    key: str
    label: int
    path: str
    size: int
    frames: tuple[str, ...] | None = None

    @property
    def is_file(self) -> bool:
        """True for a video file (decoded with PyAV), False for a frame folder."""
        return self.frames is None


@dataclass
class VideoScan:
    """The result of scanning a video source tree."""

    root: str
    classes: list[str]
    videos: list[VideoSample]
    skipped: list[SkippedInput] = field(default_factory=list)
    ignored: int = 0
    kind: str = "video"

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of every video's files."""
        return sum(v.size for v in self.videos)

    @property
    def num_files(self) -> int:
        """How many source files the videos hold (frames, or one per video file)."""
        return sum(1 if v.frames is None else len(v.frames) for v in self.videos)

    @property
    def samples(self) -> list[VideoSample]:
        """The videos (the pipeline's name for a source's samples)."""
        return self.videos

    def describe(self) -> dict[str, Any]:
        """The manifest's ``source`` entry."""
        files = sum(1 for v in self.videos if v.is_file)
        return {
            "root": self.root,
            "files": self.num_files,
            "bytes": self.total_bytes,
            "videos": len(self.videos),
            "video_files": files,
            "frame_folders": len(self.videos) - files,
        }


def _class_dirs(root: Path) -> list[str]:
    if not root.exists():
        raise SourceError(f"source {str(root)!r} does not exist")
    if not root.is_dir():
        raise SourceError(
            f"source {str(root)!r} is a file; expected a folder laid out as <class>/<video>"
        )
    try:
        names = [e.name for e in os.scandir(root) if not e.name.startswith(".") and folder_entry(e)]
    except PermissionError as exc:
        raise SourceError(f"source {str(root)!r} cannot be listed: {exc.strerror}") from exc
    if not names:
        raise SourceError(
            f"source {str(root)!r} has no class folders; expected <class>/<video>/<frame> "
            "or <class>/<video>.mp4"
        )
    return sorted(names)


def _frames_of(folder: str, result: VideoScan) -> tuple[list[str], int]:
    names: list[str] = []
    size = 0
    for entry in os.scandir(folder):
        if entry.name.startswith("."):
            continue
        if not is_image_name(entry.name) or not entry.is_file():
            result.ignored += 1
            continue
        names.append(entry.name)
        size += entry.stat().st_size
    names.sort(key=natural_key)
    return [os.path.join(folder, n) for n in names], size


def _scan_class(root: Path, class_name: str, label: int, result: VideoScan) -> int:
    folder = root / class_name
    before = len(result.videos)
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        result.skipped.append(SkippedInput(str(folder), f"cannot list folder: {exc.strerror}"))
        return 0
    taken: set[str] = set()
    for entry in entries:
        if entry.name.startswith("."):
            continue
        try:
            if entry.is_dir():
                frames, size = _frames_of(entry.path, result)
                if not frames:
                    result.skipped.append(SkippedInput(entry.path, "video folder has no frames"))
                    continue
                stem, sample_frames = entry.name, tuple(frames)
            elif is_video_name(entry.name) and entry.is_file():
                stem, size, sample_frames = (
                    os.path.splitext(entry.name)[0],
                    entry.stat().st_size,
                    None,
                )
            else:
                result.ignored += 1
                continue
        except OSError as exc:
            result.skipped.append(SkippedInput(entry.path, f"cannot read: {exc.strerror}"))
            continue
        if stem in taken:  # clip.mp4 next to a clip/ folder: keep both, keys stay unique
            stem = entry.name
        taken.add(stem)
        key = f"{class_name}/{stem}"
        result.videos.append(VideoSample(key, label, entry.path, size, sample_frames))
    return len(result.videos) - before


def scan_videos(root: str | os.PathLike[str]) -> VideoScan:
    """Scan ``root/<class>/<video>`` (frame folders and/or video files) into a :class:`VideoScan`.

    Raises:
        SourceError: missing source, no class folders, no videos, a class without videos, or a
            class that holds images directly.
    """
    root_path = Path(root)
    classes = _class_dirs(root_path)
    shapes = {c: class_shape(root_path / c) for c in classes}
    if "mixed" in shapes.values():
        detect(root_path, classes)  # raises, naming the class that holds both kinds
    direct = [c for c, shape in shapes.items() if shape == "image"]
    if direct:
        raise SourceError(
            f"source {str(root_path)!r} holds images, not videos: class {direct[0]!r} holds images "
            "directly; expected <class>/<video>/<frame> or <class>/<video>.mp4 (convert it as an "
            "image folder instead)"
        )
    result = VideoScan(root=str(root_path.resolve()), classes=classes, videos=[])
    result.skipped += [SkippedInput(p, LOOP) for p in loops_in(root_path)]
    counts = [_scan_class(root_path, c, label, result) for label, c in enumerate(classes)]
    if not result.videos:
        raise SourceError(f"source {str(root_path)!r} has no videos with frames")
    empty = [c for c, n in zip(classes, counts) if n == 0]
    if empty:
        shown = ", ".join(repr(c) for c in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise SourceError(
            f"{len(empty)} class folder(s) of {str(root_path)!r} have no videos: {shown}; "
            "remove them or add videos (labels would otherwise shift)"
        )
    return result
