"""Scan a source folder into an ordered list of samples. Scanning stats files but reads no bytes.

Image kind: ``root/<class>/<image>``, images possibly in nested sub-folders of a class folder
(``root/<class>/a/b/<image>``). Classes are the sorted first-level folder names and
``class_to_idx`` maps them to ``0..C-1`` (torchvision ``ImageFolder`` convention); a class is
walked like ImageFolder walks it (folders by relative path, files by name, symlinked folders
followed), so sample ``i`` is ImageFolder's sample ``i``. A sample's key is its path relative to
the root without the extension.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import SourceError
from packer.source.links import LOOP, folder_entry, loops_in

__all__ = [
    "IMAGE_EXTENSIONS",
    "Sample",
    "Scan",
    "SkippedInput",
    "check_source_folder",
    "natural_key",
    "path_keys",
    "scan",
    "unique_keys",
]

IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm", ".pgm", ".pbm"}
)
VIDEO_EXTENSIONS = frozenset({".mp4", ".avi", ".webm", ".mkv"})


@dataclass(frozen=True, slots=True)
class Sample:
    """One image of the source: its key (relative path, no suffix), label, path and size.

    Slotted: a million samples held through a conversion cost ~100 MB less than with a
    ``__dict__`` each (what remains is the key and path strings, ~160 bytes at ImageNet's
    name lengths)."""

    key: str
    label: int
    path: str
    size: int


@dataclass(frozen=True)
class SkippedInput:
    """An input left out of the output, with the reason (recorded in the manifest)."""

    path: str
    reason: str


@dataclass
class Scan:
    """The result of scanning a source folder."""

    root: str
    kind: str
    classes: list[str]
    samples: list[Sample]
    skipped: list[SkippedInput] = field(default_factory=list)
    ignored: int = 0  # non-image files and folders that are not samples

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Map class name to label."""
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of all samples' files."""
        return sum(s.size for s in self.samples)

    def describe(self) -> dict[str, Any]:
        """The manifest's ``source`` entry."""
        return {"root": self.root, "files": len(self.samples), "bytes": self.total_bytes}


def natural_key(name: str) -> list[int | str]:
    """Sort key that orders ``img_2`` before ``img_10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def is_image_name(name: str) -> bool:
    """Whether a file name has an image extension (case-insensitive)."""
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def is_video_name(name: str) -> bool:
    """Whether a file name has a video extension (case-insensitive)."""
    return os.path.splitext(name)[1].lower() in VIDEO_EXTENSIONS


def check_source_folder(root: Path) -> None:
    """Raise SourceError unless ``root`` is an existing folder."""
    if not root.exists():
        if root.is_symlink():
            raise SourceError(
                f"source {str(root)!r} is a symbolic link to nothing (dangling, or a loop); "
                "give the folder it should name"
            )
        raise SourceError(f"source {str(root)!r} does not exist")
    if not root.is_dir():
        raise SourceError(
            f"source {str(root)!r} is a file; expected a folder laid out as <class>/<image>"
        )


def class_dirs(root: Path) -> list[str]:
    """The sorted class folder names of ``root`` (hidden folders left out).

    Raises:
        SourceError: ``root`` is missing, a file, unreadable, or has no class folders.
    """
    check_source_folder(root)
    try:
        entries = list(os.scandir(root))
    except PermissionError as exc:
        raise SourceError(f"source {str(root)!r} cannot be listed: {exc.strerror}") from exc
    classes = sorted(e.name for e in entries if not e.name.startswith(".") and folder_entry(e))
    if not classes:
        images = sum(1 for e in entries if is_image_name(e.name) and not e.name.startswith("."))
        hint = (
            f"; it holds {images} image(s) directly: for a flat folder pass --labels FILE "
            "(e.g. ImageNet's LOC_val_solution.csv)"
            if images
            else ""
        )
        raise SourceError(
            f"source {str(root)!r} has no class folders; expected <class>/<image> "
            f"(like torchvision's ImageFolder){hint}"
        )
    return classes


def pinned_classes(root: Path, found: list[str], classes: list[str] | None) -> list[str]:
    """The class index of a source whose class folders are ``found``: ``classes`` when given
    (a split's, its training split's), which must know every one of them, else ``found``.

    Raises:
        SourceError: a class folder ``classes`` does not know.
    """
    if classes is None:
        return list(found)
    unknown = [c for c in found if c not in set(classes)]
    if unknown:
        shown = ", ".join(repr(c) for c in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        raise SourceError(
            f"{str(root)!r} has class folder(s) the class index does not know: {shown} "
            f"(the index has {len(classes)} classes, taken from the training split)"
        )
    return list(classes)


def unique_keys(keys: list[str]) -> list[str]:
    """Make keys unique, deterministically: a repeated key gets ``~2``, ``~3``, ... in order."""
    taken = set(keys)
    if len(taken) == len(keys):
        return keys
    out, seen = [], set()
    for key in keys:
        candidate, n = key, 1
        while candidate in seen or (candidate != key and candidate in taken):
            n += 1
            candidate = f"{key}~{n}"
        seen.add(candidate)
        out.append(candidate)
    return out


def path_keys(root: str | os.PathLike[str], paths: Iterable[str]) -> list[str]:
    """The keys of images ``paths`` under ``root``, by the scan's rule: the path relative to
    ``root`` without its suffix; two that differ only by suffix keep it; a key that still
    repeats gets ``~2``, ``~3``, ... (what :func:`scan` gives for every image of a class)."""
    rel = [os.path.relpath(p, root) for p in paths]
    stems = [os.path.splitext(r)[0] for r in rel]
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem] = counts.get(stem, 0) + 1
    return unique_keys([s if counts[s] == 1 else r for s, r in zip(stems, rel)])


def _keys_for(class_name: str, names: list[str]) -> list[str]:
    stems = [os.path.splitext(n)[0] for n in names]
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem] = counts.get(stem, 0) + 1
    # Two files that differ only by extension keep their extension in the key; a name that still
    # collides (a.png next to a.png.jpg) gets a numbered suffix.
    return unique_keys([f"{class_name}/{s if counts[s] == 1 else n}" for s, n in zip(stems, names)])


def _listing(folder: str, scan_result: Scan) -> list[os.DirEntry[str]] | None:
    try:
        with os.scandir(folder) as it:
            return sorted(it, key=lambda e: e.name)
    except OSError as exc:
        scan_result.skipped.append(SkippedInput(folder, f"cannot list folder: {exc.strerror}"))
        return None


def _walk(top: str, scan_result: Scan) -> list[tuple[str, list[tuple[str, int]]]]:
    """``(relative folder, [(image name, size)])`` for ``top`` and every folder under it.

    Like torchvision's ``ImageFolder`` (``sorted(os.walk(top, followlinks=True))``): symlinked
    folders are followed, folders come in the order of their relative path strings, files by
    name. Unlike it, a symlink back to a folder being walked (a loop) is skipped and recorded
    instead of recursing forever, and hidden entries are left out.
    """
    found: list[tuple[str, list[tuple[str, int]]]] = []
    # (relative folder, its stat, the (dev, ino) of the folders above it)
    pending: list[tuple[str, os.stat_result, tuple[tuple[int, int], ...]]] = [
        ("", os.stat(top), ())
    ]
    while pending:
        rel, st, above = pending.pop()
        folder = os.path.join(top, rel) if rel else top
        here = (*above, (st.st_dev, st.st_ino))
        entries = _listing(folder, scan_result)
        if entries is None:
            continue
        files: list[tuple[str, int]] = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_dir = folder_entry(entry)
                if is_dir is None:
                    scan_result.skipped.append(SkippedInput(entry.path, LOOP))
                    continue
                if is_dir:
                    sub = entry.stat()
                    if (sub.st_dev, sub.st_ino) in here:
                        scan_result.skipped.append(
                            SkippedInput(entry.path, "symlink loop (links back to a folder above)")
                        )
                    else:
                        pending.append((os.path.join(rel, entry.name), sub, here))
                    continue
                if not is_image_name(entry.name):
                    scan_result.ignored += 1
                    continue
                if not entry.is_file():
                    scan_result.skipped.append(
                        SkippedInput(entry.path, "broken symlink or not a file")
                    )
                    continue
                files.append((entry.name, entry.stat().st_size))
            except OSError as exc:
                scan_result.skipped.append(SkippedInput(entry.path, f"cannot stat: {exc.strerror}"))
        found.append((rel, files))
    return sorted(found, key=lambda item: item[0])


def _scan_class(root: Path, class_name: str, label: int, scan_result: Scan) -> None:
    folder = os.path.join(root, class_name)
    try:
        walked = _walk(folder, scan_result)
    except OSError as exc:
        scan_result.skipped.append(SkippedInput(folder, f"cannot list folder: {exc.strerror}"))
        return
    names = [os.path.join(rel, name) for rel, files in walked for name, _ in files]
    sizes = [size for _, files in walked for _, size in files]
    for key, name, size in zip(_keys_for(class_name, names), names, sizes):
        scan_result.samples.append(Sample(key, label, os.path.join(folder, name), size))


def scan(
    root: str | os.PathLike[str],
    kind: str = "image",
    classes: list[str] | None = None,
    allow_empty: bool = False,
) -> Scan:
    """Scan ``root/<class>/<image>`` into an ordered :class:`Scan`.

    Args:
        root: the source folder.
        kind: ``"image"`` (the only kind this version scans).
        classes: pin the class index (a split of a dataset takes its training split's): the
            class folders found must be among them, and keep their indices; a class without a
            folder here simply has no samples.
        allow_empty: keep a class folder without images as a class with no samples (like
            torchvision's ``allow_empty``) instead of refusing the source.

    Raises:
        SourceError: the folder is missing, a file, has no class folders, or no class has images.
    """
    if kind != "image":
        raise SourceError(f"unknown source kind {kind!r}; expected 'image'")
    root_path = Path(root)
    found = class_dirs(root_path)
    classes = pinned_classes(root_path, found, classes)
    result = Scan(root=str(root_path.resolve()), kind=kind, classes=list(classes), samples=[])
    result.skipped += [SkippedInput(p, LOOP) for p in loops_in(root_path)]
    per_class = []
    present = set(found)
    for label, class_name in enumerate(classes):
        if class_name not in present:
            continue
        before = len(result.samples)
        _scan_class(root_path, class_name, label, result)
        per_class.append(len(result.samples) - before)
    classes = [c for c in classes if c in present]
    empty = [c for c, n in zip(classes, per_class) if n == 0]
    if not result.samples:
        raise SourceError(
            f"source {str(root_path)!r} has {len(classes)} class folder(s) but no images "
            f"(looked for {', '.join(sorted(IMAGE_EXTENSIONS))})"
        )
    if empty and not allow_empty:
        shown = ", ".join(repr(c) for c in empty[:5]) + (" ..." if len(empty) > 5 else "")
        raise SourceError(
            f"{len(empty)} class folder(s) of {str(root_path)!r} have no images: {shown}; "
            "pass --allow-empty to keep them as classes with no samples, or remove them"
        )
    return result
