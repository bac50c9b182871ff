"""Flat folders whose labels are in a separate file (ImageNet's validation set, Kaggle-style sets).

``--labels FILE`` takes either a CSV with a header (the first column names the image, the second
holds its label; ImageNet's ``LOC_val_solution.csv`` — ``ImageId,PredictionString`` whose first
token is the wnid — reads as it ships) or lines of ``name label``. A label is a class name or a
class index; names match with or without their extension. ``--classes FILE`` (one class per line)
or ``--classes-from OUT`` (a packer output, or a split output) pins the class index, so val
and train agree. Every image without a label and every label without an image is listed.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from packer.errors import SourceError
from packer.manifest import load_manifest
from packer.sources import Sample, Scan, SkippedInput, is_image_name, unique_keys

__all__ = ["classes_from", "read_classes", "read_labels", "scan_flat"]


def _stem(name: str) -> str:
    return os.path.splitext(os.path.basename(name.strip()))[0]


def read_labels(path: str | os.PathLike[str]) -> dict[str, str]:
    """``{image name without extension: label token}`` from a CSV with a header or from
    ``name label`` lines.

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
    if "," in lines[0]:
        rows = list(csv.reader(lines))[1:]  # the first row is the header
    else:
        rows = [line.split(None, 1) for line in lines]
    out: dict[str, str] = {}
    for number, row in enumerate(rows, start=2 if "," in lines[0] else 1):
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


def classes_from(path: str | os.PathLike[str]) -> list[str]:
    """The class index of a packer output (or of its splits)."""
    return list(load_manifest(path).classes)


def _label_of(token: str, index: dict[str, int], count: int, where: str) -> int:
    if token in index:
        return index[token]
    if token.isdigit() and int(token) < count:
        return int(token)
    raise SourceError(
        f"{where}: label {token!r} is neither a class of the index nor an index below {count} "
        "(pin the index with --classes or --classes-from)"
    )


def scan_flat(
    root: str | os.PathLike[str],
    labels: dict[str, str],
    classes: list[str] | None = None,
    labels_name: str = "labels",
) -> Scan:
    """Scan a flat folder of images labelled by ``labels`` (see :func:`read_labels`).

    Without ``classes`` the index is the sorted set of label names. Images without a label and
    labels without an image are listed as skipped.

    Raises:
        SourceError: a missing folder, no labelled image, or a label unknown to the index.
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
        label = _label_of(token, index, len(classes), f"{labels_name} for {entry.name!r}")
        found.append((stem, label, entry.path, entry.stat().st_size))
    for stem in sorted(set(labels) - seen):
        result.skipped.append(SkippedInput(f"{labels_name}:{stem}", "label without an image"))
    if not found:
        raise SourceError(f"no image of {str(folder)!r} has a label in {labels_name}")
    keys = unique_keys([stem for stem, _, _, _ in found])
    result.samples = [
        Sample(k, label, path, size) for k, (_, label, path, size) in zip(keys, found)
    ]
    return result
