"""Tell an image class tree from a video tree, and say why. Lists folders, reads no bytes.

Each class folder is put in one of these shapes, from its entries (hidden ones ignored):

========== ========================================================== ===============
shape      what the class folder holds                                taken for
========== ========================================================== ===============
``image``  images directly (sub-folders of images may sit beside)     image class
``files``  video files (``.mp4``, ...), frame folders possibly beside   videos
``frames`` only sub-folders of images named like frame sequences       frame folders
           (``img_00001.jpg``: one name pattern, numbered)
``nested`` only sub-folders of images with other names                 either
``mixed``  images *and* video files                                    an error
========== ========================================================== ===============

A tree whose classes are all ``files``/``frames`` is video (UCF101's frame folders, Kinetics'
mp4 files); one with an ``image`` class and no video-shaped class is an image tree (ImageFolder
walks nested sub-folders). Anything else could be either, and :func:`detect_kind` refuses to
guess: the error asks for ``--kind``. Only a few sub-folders per class are listed, so detection
stays fast on a tree of a million files.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from packer.errors import SourceError
from packer.source.audio import looks_audio_tree
from packer.source.grouped import looks_grouped
from packer.source.hf_features import hf_source
from packer.source.images import class_dirs, is_image_name, is_video_name
from packer.source.tables import looks_table
from packer.source.tars import looks_tars

__all__ = [
    "SPLIT_NAMES",
    "Detection",
    "class_shape",
    "detect",
    "detect_fields",
    "detect_kind",
    "find_splits",
]

SAMPLED_SUBFOLDERS = 3  # sub-folders listed per class to tell frame folders from nested images
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class Detection:
    """What a source tree was taken for, and the one-line reason the summary shows."""

    kind: str
    reason: str


def _entries(folder: str | os.PathLike[str]) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            return [e for e in it if not e.name.startswith(".")]
    except OSError:
        return []


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a symlink loop or an unreadable entry: the scan reports it
        return False


def _frame_like(names: list[str]) -> bool:
    """Numbered names of one pattern (``img_00001.jpg``, ``img_00002.jpg``, ...)."""
    patterns = {_DIGITS.sub("#", n.lower()) for n in names}
    return len(patterns) == 1 and "#" in next(iter(patterns))


def class_shape(folder: str | os.PathLike[str]) -> str | None:
    """The shape of one class folder (see the module docstring), or None if it holds neither."""
    images = videos = False
    subfolders: list[str] = []
    for entry in _entries(folder):
        if _is_dir(entry):
            subfolders.append(entry.path)
        elif is_video_name(entry.name):
            videos = True
        elif is_image_name(entry.name):
            images = True
    frames: list[bool] = []
    for sub in sorted(subfolders)[:SAMPLED_SUBFOLDERS]:
        names = [e.name for e in _entries(sub) if is_image_name(e.name)]
        if names:
            frames.append(_frame_like(names))
    if videos:
        return "mixed" if images else "files"  # frame folders may sit beside video files
    if images:
        return "image"
    if not frames:
        return None
    return "frames" if all(frames) else "nested"


def _example(shapes: dict[str, str | None], shape: str) -> str:
    return next(c for c, s in shapes.items() if s == shape)


def detect(root: str | os.PathLike[str], classes: list[str]) -> Detection:
    """The kind of the tree ``root/<class>/...`` for the given class folder names.

    Raises:
        SourceError: a class folder holding both kinds, or a tree that could be either.
    """
    root_path = Path(root)
    shapes = {c: class_shape(root_path / c) for c in classes}
    found = {s for s in shapes.values() if s is not None}
    if "mixed" in found:
        raise SourceError(
            f"class folder {str(root_path / _example(shapes, 'mixed'))!r} holds both images and "
            "videos; a source is either <class>/<image> or <class>/<video>/<frame>: move one kind out"
        )
    if found <= {"files", "frames"} and found:
        files = sum(s == "files" for s in shapes.values())
        frames = sum(s == "frames" for s in shapes.values())
        parts = [
            f"{n} class(es) of {what}"
            for n, what in ((frames, "numbered frame folders"), (files, "video files"))
            if n
        ]
        return Detection("video", " and ".join(parts))
    if found <= {"image", "nested"}:
        if "image" not in found and found:
            raise SourceError(
                f"{str(root_path)!r} could be either kind: its classes hold only sub-folders of "
                f"images (e.g. {_example(shapes, 'nested')!r}) whose names are not frame "
                "sequences; pass --kind image (nested image folders, like ImageFolder) or "
                "--kind video (each sub-folder is one video)"
            )
        nested = sum(s == "nested" for s in shapes.values())
        reason = "images in class folders" + (
            f" ({nested} with only sub-folders)" if nested else ""
        )
        return Detection("image", reason)
    if "image" in found and "files" in found:
        raise SourceError(
            f"source {str(root_path)!r} mixes kinds: class {_example(shapes, 'image')!r} holds "
            f"images directly but class {_example(shapes, 'files')!r} holds video files; use one "
            "layout"
        )
    video_like = "frames" if "frames" in found else "files"
    image_like = "image" if "image" in found else "nested"
    raise SourceError(
        f"{str(root_path)!r} could be either kind: class {_example(shapes, image_like)!r} looks "
        f"like an image class but class {_example(shapes, video_like)!r} looks like a class of "
        "videos (numbered frame folders); pass --kind image (sub-folders walked like "
        "ImageFolder) or --kind video, or make the layout uniform"
    )


def detect_kind(root: str | os.PathLike[str]) -> str:
    """``"image"`` or ``"video"`` for ``root`` (see :func:`detect`); an empty tree is ``"image"``.

    Raises:
        SourceError: a missing source or one without class folders, or :func:`detect`'s errors.
    """
    return detect(root, class_dirs(Path(root))).kind


SPLIT_NAMES = ("train", "val", "validation", "test")


def _folders(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if _is_dir(e) and not e.name.startswith("."))
    except OSError as exc:
        raise SourceError(f"source {str(root)!r} cannot be listed: {exc.strerror}") from exc


def find_splits(root: str | os.PathLike[str]) -> list[str]:
    """The split folders of ``root`` in order (train first), or [] if it is not a split root.

    Raises:
        SourceError: split folders side by side with other folders (which is which is unclear).
    """
    path = Path(root)
    if not path.is_dir():
        return []
    folders = _folders(path)
    named = [f for f in folders if f.lower() in SPLIT_NAMES]
    if not named:
        return []
    others = [f for f in folders if f not in named]
    if others:
        raise SourceError(
            f"{str(path)!r} holds split folders ({', '.join(named)}) next to other folders "
            f"({', '.join(others[:3])}{' ...' if len(others) > 3 else ''}): convert one split "
            f"with --split {named[0]}, or move the others out"
        )
    return sorted(named, key=lambda f: (SPLIT_NAMES.index(f.lower()), f))


def detect_fields(root: str | os.PathLike[str]) -> Detection | None:
    """``tars`` when ``root`` names WebDataset tar shards, ``table`` a table of samples (.csv,
    .tsv, .jsonl, .parquet), ``files`` when it directly holds
    key-grouped files (``0001.jpg`` beside
    ``0001.txt``), ``audio`` class folders of audio clips, None when nothing says it holds
    samples with fields (a class tree of images or videos).

    Raises:
        SourceError: the root is not grouped but its first sub-folders are (a class tree of
            images with captions, or shards of grouped files: either could be meant).
    """
    root_path = Path(root)
    hf = hf_source(root_path)
    if hf is not None:
        return Detection("hf", f"Hugging Face datasets: {hf.what}")
    if looks_tars(root):
        return Detection("tars", "WebDataset tar shards")
    if looks_table(root):
        return Detection("table", f"a table of samples ({root_path.suffix.lower()})")
    if not root_path.is_dir():
        return None
    if looks_grouped(root_path):
        return Detection("files", "files sharing a key (0001.jpg beside 0001.txt)")
    if looks_audio_tree(root_path):
        return Detection("audio", "audio clips in class folders")
    folders = [e for e in _entries(root_path) if _is_dir(e)][:SAMPLED_SUBFOLDERS]
    grouped = [
        e.name
        for e in sorted(folders, key=lambda e: e.name)
        if looks_grouped(Path(e.path), beside_images=True)
    ]
    if grouped:
        raise SourceError(
            f"{str(root_path)!r} could be either kind: its sub-folder {grouped[0]!r} holds files "
            "sharing a key (0001.jpg beside 0001.txt); pass --kind files (samples with fields, "
            "keys keep their folder) or --kind image (class folders; other files ignored)"
        )
    return None
