"""Flat folders whose labels are in a separate file (ImageNet's validation set, Kaggle-style sets).

``--labels FILE`` takes either a CSV with a header (the first column names the image, the second
holds its label; ImageNet's ``LOC_val_solution.csv`` — ``ImageId,PredictionString`` whose first
token is the wnid — reads as it ships) or lines of ``name label``. A label is a class name or a
class index; names match with or without their extension. ``--classes FILE`` (one class per line)
or ``--classes-from OUT`` (a packer output, or a split output) pins the class index, so val
and train agree. Every image without a label and every label without an image is listed.

On a root of splits, ``--labels FILE`` labels the one flat split and ``--labels SPLIT=FILE``
names the split (:func:`labels_option`).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from packer.core.manifest import load_manifest
from packer.errors import SourceError
from packer.source.images import Sample, Scan, SkippedInput, is_image_name, unique_keys

__all__ = [
    "INDEX_FROM_LABELS",
    "Labels",
    "class_index_of",
    "classes_from",
    "labels_option",
    "one_labels_file",
    "pinned_classes",
    "read_classes",
    "read_labels",
    "scan_flat",
]

INDEX_FROM_LABELS = "class-index-from-labels"
"""The code of the warning that a flat folder's class index comes from its labels file alone."""

Labels = str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]]
"""A labels file, or labels files by split name (the key ``""`` labels the one flat split)."""


def _stem(name: str) -> str:
    return os.path.splitext(os.path.basename(name.strip()))[0]


def read_labels(path: str | os.PathLike[str]) -> dict[str, str]:
    """``{image name without extension: label token}`` from a CSV or from ``name label`` lines.
    A CSV's first row is its header unless its first field names an image file
    (``img_001.jpg,cat``): a CSV without a header keeps its first row.

    Raises:
        SourceError: unreadable, empty, or a line without a label.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read labels file {str(file)!r}: {exc}") from exc
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise SourceError(f"labels file {str(file)!r} is empty")
    header = 0
    if "," in lines[0]:
        rows = list(csv.reader(lines))
        # the first row is a header (ImageId,PredictionString) unless it names an image file
        header = 0 if rows[0] and is_image_name(rows[0][0].strip()) else 1
        rows = rows[header:]
    else:
        rows = [line.split(None, 1) for line in lines]
    out: dict[str, str] = {}
    for number, row in enumerate(rows, start=1 + header):
        if len(row) < 2 or not row[1].strip():
            raise SourceError(f"{str(file)!r} line {number}: expected a name and a label")
        out[_stem(row[0])] = row[1].split()[0]  # LOC_val_solution: the wnid leads the boxes
    return out


def read_classes(path: str | os.PathLike[str]) -> list[str]:
    """Class names in label order, one per line."""
    try:
        names = [n.strip() for n in Path(path).read_text(encoding="utf-8").splitlines()]
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read classes file {str(path)!r}: {exc}") from exc
    names = [n for n in names if n]
    if not names or len(set(names)) != len(names):
        raise SourceError(f"classes file {str(path)!r} is empty or names a class twice")
    return names


def pinned_classes(
    classes: str | os.PathLike[str] | None, output: str | os.PathLike[str] | None
) -> list[str] | None:
    """The class index ``--classes FILE`` or ``--classes-from OUTPUT`` pins, or None.

    Raises:
        SourceError: both given, or a file that cannot be read.
    """
    if classes is not None and output is not None:
        raise SourceError("--classes and --classes-from are exclusive; pass one")
    if classes is not None:
        return read_classes(classes)
    return classes_from(output) if output is not None else None


def classes_from(path: str | os.PathLike[str]) -> list[str]:
    """The class index of a packer output (or of its splits)."""
    return list(load_manifest(path).classes)


def labels_option(values: Sequence[str]) -> Labels | None:
    """The ``labels`` argument of :func:`packer.write.convert.convert` from ``--labels`` values:
    ``FILE`` (the flat folder, or the one flat split of a root of splits) or ``SPLIT=FILE``
    (repeatable). A value naming an existing file is a file even if it holds ``=``.

    Raises:
        SourceError: a split named twice, or two bare files.
    """
    if not values:
        return None
    if len(values) == 1 and not _split_value(values[0]):
        return values[0]
    out: dict[str, str] = {}
    for value in values:
        split, _, file = value.partition("=") if _split_value(value) else ("", "", value)
        if split in out:
            which = f"split {split!r}" if split else "the flat split"
            raise SourceError(
                f"--labels names two files for {which} ({out[split]!r} and {file!r}); "
                "pass one --labels SPLIT=FILE per split"
            )
        out[split] = file
    return out


def _split_value(value: str) -> bool:
    split, sep, file = value.partition("=")
    return bool(sep and split and file and "/" not in split and not os.path.exists(value))


def _unknown_labels(unknown: dict[str, str], count: int, labels_name: str, index_from: str) -> str:
    tokens = sorted(set(unknown.values()))
    shown = ", ".join(repr(t) for t in tokens[:5]) + (" ..." if len(tokens) > 5 else "")
    first = next(iter(unknown))
    return (
        f"{labels_name}: {len(unknown)} image(s) have a label that is not a class of the index "
        f"({count} classes, {index_from}) nor an index below {count}: {shown} "
        f"(e.g. {first!r}); fix the labels file, or pin the index with --classes FILE or "
        "--classes-from OUTPUT"
    )


def scan_flat(
    root: str | os.PathLike[str],
    labels: dict[str, str],
    classes: list[str] | None = None,
    labels_name: str = "labels",
    index_from: str = "the given index",
) -> Scan:
    """Scan a flat folder of images labelled by ``labels`` (see :func:`read_labels`).

    Without ``classes`` the index is the sorted set of label names. Images without a label and
    labels without an image are listed as skipped.

    Raises:
        SourceError: a missing folder, no labelled image, or labels unknown to the index (all
            listed; ``index_from`` says where the index came from).
    """
    folder = Path(root)
    if not folder.is_dir():
        raise SourceError(f"source {str(folder)!r} is not a folder")
    if classes is None:
        classes = sorted({t for t in labels.values() if not t.isdigit()})
    index = {name: i for i, name in enumerate(classes)}
    result = Scan(root=str(folder.resolve()), kind="image", classes=list(classes), samples=[])
    entries = sorted(
        (e for e in os.scandir(folder) if not e.name.startswith(".")), key=lambda e: e.name
    )
    seen: set[str] = set()
    unknown: dict[str, str] = {}
    found: list[tuple[str, int, str, int]] = []
    for entry in entries:
        if not is_image_name(entry.name) or not entry.is_file():
            result.ignored += 1
            continue
        stem = _stem(entry.name)
        token = labels.get(stem)
        if token is None:
            result.skipped.append(SkippedInput(entry.path, f"no label in {labels_name}"))
            continue
        seen.add(stem)
        label = index.get(token, int(token) if token.isdigit() else len(classes))
        if label >= len(classes):
            unknown[entry.name] = token
            continue
        found.append((stem, label, entry.path, entry.stat().st_size))
    if unknown:
        raise SourceError(_unknown_labels(unknown, len(classes), labels_name, index_from))
    for stem in sorted(set(labels) - seen):
        result.skipped.append(SkippedInput(f"{labels_name}:{stem}", "label without an image"))
    if not found:
        raise SourceError(f"no image of {str(folder)!r} has a label in {labels_name}")
    keys = unique_keys([stem for stem, _, _, _ in found])
    result.samples = [
        Sample(k, label, path, size) for k, (_, label, path, size) in zip(keys, found)
    ]
    return result


def class_index_of(
    classes: int, labels: str | os.PathLike[str] | None, given: bool, folders: bool = True
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """Where a (one-folder) conversion's class index of ``classes`` classes came from, for the
    summary, and the warning when it was derived from a labels file alone.

    Returns:
        ``({"source": "given"|"labels-file"|"class-folders", "detail": text}, warnings)``.
    """
    if given:
        return {"source": "given", "detail": f"the given class index ({classes} classes)"}, []
    if labels is None:
        what = "class folders" if folders else "classes"
        return {"source": "class-folders", "detail": f"{classes} {what}"}, []
    name = os.path.basename(labels)
    detail = f"labels file {name} alone: the sorted names of its {classes} classes"
    warning = (
        f"warning: the class index was derived from {name} alone (the sorted names of its "
        "labels): a class without a label here shifts the index of every class after it, so "
        "labels may disagree with the training output's; pass --classes-from TRAIN_OUTPUT "
        "(or --classes FILE) to use the training index"
    )
    return {"source": "labels-file", "detail": detail}, [
        {"code": INDEX_FROM_LABELS, "message": warning}
    ]


def one_labels_file(
    labels: Mapping[str, str | os.PathLike[str]], src: Path
) -> str | os.PathLike[str]:
    """The one labels file of ``{"": file}`` (``--labels FILE``) for a folder that is not a
    root of splits.

    Raises:
        SourceError: a file named for a split.
    """
    named = [s for s in labels if s]
    if named or len(labels) != 1:
        raise SourceError(
            f"--labels {named[0] if named else ''}=FILE names a split, but {str(src)!r} is not "
            "a root of splits (train/, val/, ...): pass --labels FILE"
        )
    return labels[""]
