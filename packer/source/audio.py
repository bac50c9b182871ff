"""Class folders of audio clips (``root/<class>/<clip>.wav``: Speech Commands, ESC-50 and
UrbanSound laid out by class), scanned into samples with two fields. Lists folders, reads no
byte.

A clip is a sample of field ``audio`` (kind ``audio``: the file's bytes, unchanged) and field
``label`` (kind ``int``: its class's index), so a class tree of clips reads like a Hugging Face
table of ``Audio`` and ``ClassLabel`` columns; the classes are the sorted class folder names
(``ImageFolder``'s rule) and the key is the clip's path relative to the root without its
suffix. Clips in sub-folders of a class folder are walked too (folders and files by name);
hidden entries are left out, a link is never followed here (the loader reads each file beneath
the root).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from packer.core.fields import AUDIO_SUFFIXES
from packer.errors import SourceError
from packer.source.images import (
    SkippedInput,
    class_dirs,
    is_image_name,
    is_video_name,
    path_keys,
    pinned_classes,
)
from packer.source.samples import FieldSample, FieldScan, Part, finish_scan

__all__ = ["AUDIO_KINDS", "is_audio_name", "looks_audio_tree", "scan_audio"]

AUDIO_KINDS = {"audio": "audio", "label": "int"}  # the fields of a class tree of clips
_SAMPLED = 8  # class folders listed to tell a tree of clips from a tree of images


def is_audio_name(name: str) -> bool:
    """Whether a file name has an audio suffix (``.wav .flac .mp3 .ogg .oga .opus .m4a``)."""
    return name.lower().endswith(AUDIO_SUFFIXES)


def _names(folder: Path) -> list[str]:
    try:
        with os.scandir(folder) as it:
            return [e.name for e in it if not e.name.startswith(".")]
    except OSError:
        return []


def looks_audio_tree(root: str | os.PathLike[str]) -> bool:
    """Whether ``root``'s first class folders hold audio clips directly (and no other kind of
    sample: an image or a video beside the clips makes it another tree)."""
    path = Path(root)
    if not path.is_dir():
        return False
    try:
        classes = class_dirs(path)
    except SourceError:
        return False
    clips = False
    for name in classes[:_SAMPLED]:
        names = _names(path / name)
        if any(is_image_name(n) or is_video_name(n) for n in names):
            return False
        clips = clips or any(is_audio_name(n) for n in names)
    return clips


def _clips(folder: Path, skipped: list[SkippedInput]) -> list[tuple[str, int]]:
    """``(path, size)`` of every clip under ``folder``, folders and files by name."""

    def unlisted(exc: OSError) -> None:
        skipped.append(SkippedInput(str(exc.filename), f"cannot list folder: {exc.strerror}"))

    out: list[tuple[str, int]] = []
    for top, dirs, files in os.walk(folder, onerror=unlisted):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith(".") or not is_audio_name(name):
                continue
            path = os.path.join(top, name)
            try:
                st = os.stat(path)
            except OSError as exc:
                skipped.append(SkippedInput(path, f"cannot stat: {exc.strerror or exc}"))
                continue
            if not stat.S_ISREG(st.st_mode):
                skipped.append(SkippedInput(path, "not a regular file"))
                continue
            out.append((path, st.st_size))
    return out


def scan_audio(
    root: str | os.PathLike[str],
    required: list[str] | None = None,
    classes: list[str] | None = None,
) -> FieldScan:
    """Scan ``root/<class>/<clip>`` into samples of fields ``audio`` and ``label``;
    ``classes`` pins the class index (a split's: its training split's folders), else it is
    ``root``'s sorted class folders.

    Raises:
        SourceError: a missing source, one without class folders, a class folder the pinned
            index does not know, or no clip in any class.
    """
    path = Path(root)
    folders = class_dirs(path)
    classes = pinned_classes(path, folders, classes)
    scan = FieldScan(root=str(path.resolve()), kind="fields", classes=classes, samples=[])
    scan.source_kind = "audio"
    found: list[tuple[str, int, int]] = []
    present = set(folders)
    for label, name in enumerate(classes):
        if name in present:
            found += [(p, size, label) for p, size in _clips(path / name, scan.skipped)]
    if not found:
        raise SourceError(
            f"source {str(path)!r} has {len(folders)} class folder(s) but no audio clips "
            f"(looked for {', '.join(AUDIO_SUFFIXES)})"
        )
    keys = path_keys(path, [p for p, _, _ in found])
    samples = []
    for key, (clip, size, label) in zip(keys, found):
        text = str(label).encode()
        parts = (Part("audio", clip, size), Part("label", clip, len(text), data=text))
        samples.append(FieldSample(key, clip, size + len(text), parts))
    return finish_scan(scan, samples, required, repr(str(path)), AUDIO_KINDS)
