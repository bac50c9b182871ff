"""Key-grouped files (WebDataset's naming): files of one folder sharing a key form one sample.

A file's key is its path relative to the source without everything from the first dot of its
name; the rest, lower-cased, is its field: ``0001.jpg``, ``0001.txt``, ``0001.json``,
``0001.seg.png`` are sample ``0001`` with fields ``jpg``, ``txt``, ``json``, ``seg.png``.
Folders are walked in the order of their relative paths, files by name, hidden entries left
out, symlinked folders not followed (a file linking outside the source is skipped when read,
unless ``--follow-links``: :mod:`packer.source.links`). Lists and stats only: no byte is read.

What is skipped, each with its reason: a file whose field is not a plain name, a sample with
two files for one field (``0001.jpg`` and ``0001.JPG``), keys that repeat or differ only by
case, samples without a ``--require``\\ d field, a sample one of whose files is unusable (a
FIFO, socket, device, dangling link or symlink loop: skipped whole, that field's reason given,
never kept without it). Files with no dot in their name are ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

from packer.errors import SourceError
from packer.source.images import SkippedInput, check_source_folder, is_image_name
from packer.source.links import LOOP, folder_entry
from packer.source.samples import (
    FieldSample,
    FieldScan,
    Part,
    declare_fields,
    finish_scan,
    sample_of,
)

__all__ = ["looks_grouped", "scan_grouped"]


def _split(name: str) -> tuple[str, str] | None:
    """``(key part, field)`` of a file name, or None when it has no dot after its first
    character."""
    dot = name.find(".", 1)
    if dot < 0:
        return None
    return name[:dot], name[dot + 1 :].lower()


def looks_grouped(root: Path, sampled: int = 200, beside_images: bool = False) -> bool:
    """Whether ``root`` directly holds files of which two share a key (``0001.jpg`` and
    ``0001.txt``): the shape of key-grouped files (lists one folder). ``beside_images``: only
    when one of them is not an image (a class folder may hold ``a.jpg`` beside ``a.png``)."""
    try:
        with os.scandir(root) as it:
            names = [e.name for _, e in zip(range(sampled), it) if not e.name.startswith(".")]
    except OSError:
        return False
    keys: dict[str, bool] = {}  # key -> whether a file of it is not an image
    for name in sorted(names):
        got = _split(name)
        if got is None:
            continue
        other = not is_image_name(name)
        if got[0] in keys and (not beside_images or other or keys[got[0]]):
            return True
        keys[got[0]] = keys.get(got[0], False) or other
    return False


Listed = tuple[str, int, str]  # a file's name, its size, and why it is unusable ("" if usable)


def _entry(entry: os.DirEntry[str], pending: list[str], rel: str) -> tuple[int, str] | None:
    """A listed entry as ``(size, why unusable)``, or None for a folder (queued in ``pending``
    when it is no link)."""
    if entry.is_dir(follow_symlinks=False):
        pending.append(os.path.join(rel, entry.name))
        return None
    is_dir = folder_entry(entry)
    if is_dir is None:
        return 0, LOOP
    if is_dir:
        return 0, "symlinked folder (not followed)"
    if entry.is_file():
        return entry.stat().st_size, ""
    return 0, "broken symlink or not a file (a FIFO, socket or device?)"


def _walk(root: str, skipped: list[SkippedInput]) -> list[tuple[str, list[Listed]]]:
    """``(relative folder, [(file name, size, why unusable)])`` of every folder, in
    relative-path order."""
    found = []
    pending = [""]
    while pending:
        rel = pending.pop()
        folder = os.path.join(root, rel) if rel else root
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            skipped.append(SkippedInput(folder, f"cannot list folder: {exc.strerror}"))
            continue
        files: list[Listed] = []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                got = _entry(entry, pending, rel)
            except OSError as exc:
                got = 0, f"cannot stat: {exc.strerror}"
            if got is not None:
                files.append((entry.name, *got))
        found.append((rel, files))
    return sorted(found, key=lambda item: item[0])


def _group(root: str, rel: str, files: list[Listed], scan: FieldScan) -> list[FieldSample]:
    """The samples of one folder's files, in key order; a sample one of whose files is
    unusable is skipped whole, with that field's reason."""
    by_key: dict[str, list[Part]] = {}
    unusable: dict[str, str] = {}  # key -> the reason of its first unusable field
    for name, size, why in files:
        got = _split(name)
        path = os.path.join(root, rel, name)
        if got is None or (why and why.startswith("symlinked folder")):
            if why:
                scan.skipped.append(SkippedInput(path, why))
            else:
                scan.ignored += 1
            continue
        stem, field = got
        try:
            declare_fields([field], repr(path))
        except SourceError as exc:
            scan.skipped.append(SkippedInput(path, str(exc)))
            continue
        if why:
            unusable.setdefault(stem, f"field {field!r}: {name!r}: {why}")
            continue
        by_key.setdefault(stem, []).append(Part(field, path, size))
    out = []
    for stem in sorted(set(by_key) | set(unusable)):
        key = os.path.join(rel, stem) if rel else stem
        where = os.path.join(root, key) + ".*"
        if stem in unusable:
            scan.skipped.append(SkippedInput(where, unusable[stem]))
            continue
        sample = sample_of(key, where, by_key[stem], scan.skipped)
        if sample is not None:
            out.append(sample)
    return out


def scan_grouped(root: str | os.PathLike[str], required: list[str] | None = None) -> FieldScan:
    """Scan a folder of key-grouped files into an ordered :class:`FieldScan`.

    Raises:
        SourceError: the folder is missing or a file, holds no sample, has more than
            ``MAX_FIELDS`` field names, or a ``required`` field that no sample has.
    """
    path = Path(root)
    check_source_folder(path)
    top = str(path)
    scan = FieldScan(root=str(path.resolve()), kind="fields", classes=[], samples=[])
    scan.source_kind = "files"
    samples: list[FieldSample] = []
    for rel, files in _walk(top, scan.skipped):
        samples += _group(top, rel, files, scan)
    if not samples:
        raise SourceError(
            f"{top!r} holds no key-grouped files (files sharing a key: 0001.jpg, 0001.txt)"
        )
    return finish_scan(scan, samples, required, repr(top))
