"""COCO as a source: an image folder plus its instances and/or captions JSON files.

Each image the files list is one sample, keyed by its ``file_name`` without the suffix, with
the fields ``image`` (its bytes, unchanged), ``meta`` (the image's entry: ``id``, ``width``,
``height``, ...), ``annotations`` (an instances file's annotations of the image, in file order,
every key kept: ``bbox``, ``category_id``, ``iscrowd``, ``area``, ``segmentation`` as polygons or
RLE; ``[]`` for an image without any, which is kept) and ``captions`` (a captions file's
captions of the image). The categories (``id``, ``name``, ``supercategory``) go to the
manifest, sorted by id.

Skipped, each with its reason: an image whose file is missing or whose ``file_name`` is
absolute or climbs out of the folder; an image one of whose annotations names a category the
files do not list (its boxes would be wrong); an annotation naming an image the files do not
list. Refused in one line: a file that is not COCO JSON, an image id listed twice with two
file names, a category id with two names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from packer.errors import SourceError
from packer.source.images import SkippedInput, check_source_folder
from packer.source.samples import FieldSample, FieldScan, Part, finish_scan

__all__ = ["scan_coco"]

KINDS = {"image": "image", "meta": "json", "annotations": "json", "captions": "json"}


def _load(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise SourceError(f"annotations {path!r} cannot be read: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, ValueError) as exc:
        raise SourceError(f"annotations {path!r} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise SourceError(f"annotations {path!r} is not a COCO file (no 'images' list)")
    for name in ("annotations", "categories"):
        if not isinstance(data.get(name, []), list):
            raise SourceError(f"annotations {path!r}: {name!r} is not a list")
    return data


class _Merged:
    """The images, categories, annotations and captions of every file, checked against each
    other."""

    def __init__(self, skipped: list[SkippedInput]) -> None:
        self.images: dict[int, dict[str, Any]] = {}
        self.categories: dict[int, dict[str, Any]] = {}
        self.annotations: dict[int, list[dict[str, Any]]] = {}
        self.captions: dict[int, list[str]] = {}
        self.bad_category: dict[int, str] = {}
        self.has_instances = False
        self.has_captions = False
        self.skipped = skipped

    def add(self, path: str) -> None:
        data = _load(path)
        for image in data["images"]:
            if not isinstance(image, dict) or not isinstance(image.get("id"), int):
                raise SourceError(f"annotations {path!r}: an image without an integer 'id'")
            if not isinstance(image.get("file_name"), str):
                raise SourceError(f"annotations {path!r}: image {image['id']} has no file_name")
            known = self.images.setdefault(image["id"], image)
            if known["file_name"] != image["file_name"]:
                raise SourceError(
                    f"annotations {path!r}: image {image['id']} is {image['file_name']!r} here "
                    f"and {known['file_name']!r} in another file"
                )
        for category in data.get("categories", []):
            cid, name = category.get("id"), category.get("name")
            if not isinstance(cid, int) or not isinstance(name, str):
                raise SourceError(
                    f"annotations {path!r}: a category without an integer id and name"
                )
            known = self.categories.setdefault(cid, category)
            if known.get("name") != name:
                raise SourceError(
                    f"annotations {path!r}: category {cid} is {name!r} here and "
                    f"{known.get('name')!r} in another file"
                )
        for n, note in enumerate(data.get("annotations", [])):
            self._note(path, n, note)

    def _note(self, path: str, n: int, note: Any) -> None:
        image_id = note.get("image_id") if isinstance(note, dict) else None
        where = f"{path}: annotation {note.get('id', n) if isinstance(note, dict) else n}"
        if image_id not in self.images:
            self.skipped.append(SkippedInput(where, f"names image {image_id!r}, not listed"))
            return
        if "caption" in note and "category_id" not in note:
            self.has_captions = True
            self.captions.setdefault(image_id, []).append(str(note["caption"]))
            return
        self.has_instances = True
        self.annotations.setdefault(image_id, []).append(note)

    def check_categories(self) -> None:
        """Mark every image one of whose annotations names an unlisted category."""
        for image_id, notes in self.annotations.items():
            for note in notes:
                if note.get("category_id") not in self.categories:
                    self.bad_category[image_id] = (
                        f"annotation {note.get('id')!r} names category "
                        f"{note.get('category_id')!r}, which the files do not list"
                    )
                    break


def _sample(root: str, image: dict[str, Any], merged: _Merged, source: str) -> FieldSample | str:
    """The sample of one image, or why it is skipped."""
    name = image["file_name"]
    if os.path.isabs(name) or ".." in Path(name).parts:
        return f"file_name {name!r} is outside the image folder"
    if image["id"] in merged.bad_category:
        return merged.bad_category[image["id"]]
    path = os.path.join(root, name)
    try:
        size = os.stat(path).st_size
    except OSError as exc:
        return f"image file {name!r}: {exc.strerror}"
    values: dict[str, Any] = {"meta": image}
    if merged.has_instances:
        values["annotations"] = merged.annotations.get(image["id"], [])
    if merged.has_captions:
        values["captions"] = merged.captions.get(image["id"], [])
    parts = [Part("image", path, size)]
    for field, value in values.items():
        data = json.dumps(value, ensure_ascii=False).encode()
        parts.append(Part(field, source, len(data), data=data))
    key = os.path.splitext(name)[0]
    total = sum(p.size for p in parts)
    return FieldSample(key, path, total, tuple(sorted(parts, key=lambda p: p.field)))


def scan_coco(
    src: str | os.PathLike[str], annotations: list[str], required: list[str] | None = None
) -> FieldScan:
    """Scan a COCO image folder and its annotation files into an ordered :class:`FieldScan`.

    Raises:
        SourceError: no annotation file, a file that is not COCO JSON or contradicts another,
            no usable image, or a ``required`` field no sample has.
    """
    if not annotations:
        raise SourceError("a COCO source needs its annotations: --annotations instances.json")
    root = Path(src)
    check_source_folder(root)
    scan = FieldScan(root=str(root.resolve()), kind="fields", classes=[], samples=[])
    scan.source_kind = "coco"
    merged = _Merged(scan.skipped)
    for path in annotations:
        merged.add(os.fspath(path))
    merged.check_categories()
    samples = []
    source = os.fspath(annotations[0])
    for image in sorted(merged.images.values(), key=lambda i: i["file_name"]):
        got = _sample(str(root), image, merged, source)
        if isinstance(got, str):
            scan.skipped.append(SkippedInput(os.path.join(str(root), image["file_name"]), got))
        else:
            samples.append(got)
    if not samples:
        raise SourceError(f"no image the annotations list was found in {str(root)!r}")
    scan.recorded = {
        "categories": [
            {k: c.get(k) for k in ("id", "name", "supercategory") if k in c}
            for _, c in sorted(merged.categories.items())
        ]
    }
    return finish_scan(scan, samples, required, repr(str(root)), KINDS)
