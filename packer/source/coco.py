"""COCO as a source: an image folder plus its instances and/or captions JSON files.

Each image the files list is one sample, keyed by its ``file_name`` without the suffix, with
the fields ``image`` (its bytes, unchanged), ``meta`` (the image's entry: ``id``, ``width``,
``height``, ...), ``annotations`` (an instances file's annotations of the image, in file order,
every key kept: ``bbox``, ``category_id``, ``iscrowd``, ``area``, ``segmentation`` as polygons or
RLE; ``[]`` for an image without any, which is kept) and ``captions`` (a captions file's
captions of the image). The categories (``id``, ``name``, ``supercategory``) go to the
manifest, sorted by id.

Skipped, each with its reason: an image whose file is missing or whose ``file_name`` is
absolute, climbs out of the folder, holds a NUL or a lone surrogate; an image one of whose
annotations names a category the files do not list (its boxes would be wrong), has a caption
that is not text or is panoptic; an image listed twice with other metadata; an annotation naming
an image the files do not list; an annotation repeated in another file (kept once). Refused in
one line: a file that is not COCO JSON (or not a regular file, or nested too deep), the same
file twice, an image id listed twice with two file names, a category that is not an object, a
category id outside 0..2**63-1 or with two names, an annotation id repeated with other content.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypeGuard

from packer.errors import SourceError
from packer.source.images import SkippedInput, check_source_folder
from packer.source.json_bounded import INT64, dumps_utf8, inside_path, loads_bounded, read_regular
from packer.source.samples import FieldSample, FieldScan, Part, finish_scan, why_none

__all__ = ["scan_coco"]

CATEGORY_KEYS = ("id", "name", "supercategory", "keypoints", "skeleton")  # what is recorded
KINDS = {"image": "image", "meta": "json", "annotations": "json", "captions": "json"}


def _load(path: str) -> dict[str, Any]:
    try:
        data = loads_bounded(read_regular(path))
    except OSError as exc:
        raise SourceError(f"annotations {path!r} cannot be read: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise SourceError(f"annotations {path!r} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("images"), list):
        raise SourceError(f"annotations {path!r} is not a COCO file (no 'images' list)")
    for name in ("annotations", "categories"):
        if not isinstance(data.get(name, []), list):
            raise SourceError(f"annotations {path!r}: {name!r} is not a list")
    return data


def _is_id(value: Any) -> TypeGuard[int]:
    """An id: an int (never a bool: ``true`` is not image 1)."""
    return type(value) is int


def _category(path: str, category: Any) -> tuple[int, dict[str, Any]]:
    """A category entry's id and entry, checked as the manifest holds them."""
    if not isinstance(category, dict):
        raise SourceError(
            f"annotations {path!r}: a category that is not an object: {category!r:.60}"
        )
    cid, name = category.get("id"), category.get("name")
    if not _is_id(cid) or not isinstance(name, str):
        raise SourceError(f"annotations {path!r}: a category without an integer id and name")
    if not 0 <= cid <= INT64[1]:
        raise SourceError(
            f"annotations {path!r}: category id {cid} is outside 0..{INT64[1]} (a dataset "
            "could not record it); renumber the categories"
        )
    try:
        dumps_utf8(category, f"category {cid}")
    except ValueError as exc:
        raise SourceError(f"annotations {path!r}: {exc}") from None
    return cid, category


class _Merged:
    """The images, categories, annotations and captions of every file, checked against each
    other."""

    def __init__(self, skipped: list[SkippedInput]) -> None:
        self.images: dict[int, dict[str, Any]] = {}
        self.categories: dict[int, dict[str, Any]] = {}
        self.annotations: dict[int, list[dict[str, Any]]] = {}
        self.captions: dict[int, list[str]] = {}
        self.bad: dict[int, str] = {}  # image id -> why the image is skipped
        self.notes: dict[tuple[str, int], tuple[str, dict[str, Any]]] = {}  # (kind, id) -> first
        self.files: dict[tuple[int, int], str] = {}  # (device, inode) -> path given
        self.has_instances = False
        self.has_captions = False
        self.skipped = skipped

    def add(self, path: str) -> None:
        self._once(path)
        data = _load(path)
        for image in data["images"]:
            self._image(path, image)
        for category in data.get("categories", []):
            cid, category = _category(path, category)
            known = self.categories.setdefault(cid, category)
            if known.get("name") != category["name"]:
                raise SourceError(
                    f"annotations {path!r}: category {cid} is {category['name']!r} here and "
                    f"{known.get('name')!r} in another file"
                )
        for n, note in enumerate(data.get("annotations", [])):
            self._note(path, n, note)

    def _once(self, path: str) -> None:
        try:
            info = os.stat(path)
        except (OSError, ValueError):
            return  # _load says why
        given = self.files.get((info.st_dev, info.st_ino))
        self.files[(info.st_dev, info.st_ino)] = path
        if given is not None:
            raise SourceError(
                f"annotations {path!r} is given twice (also as {given!r}): name each file once"
            )

    def _image(self, path: str, image: Any) -> None:
        if not isinstance(image, dict) or not _is_id(image.get("id")):
            raise SourceError(f"annotations {path!r}: an image without an integer 'id'")
        if not isinstance(image.get("file_name"), str):
            raise SourceError(f"annotations {path!r}: image {image['id']} has no file_name")
        known = self.images.setdefault(image["id"], image)
        if known["file_name"] != image["file_name"]:
            raise SourceError(
                f"annotations {path!r}: image {image['id']} is {image['file_name']!r} here "
                f"and {known['file_name']!r} in another file"
            )
        if known != image:
            self.bad.setdefault(
                image["id"], f"image {image['id']} is listed twice with different entries"
            )

    def _note(self, path: str, n: int, note: Any) -> None:
        image_id = note.get("image_id") if isinstance(note, dict) else None
        where = f"{path}: annotation {note.get('id', n) if isinstance(note, dict) else n}"
        if not _is_id(image_id) or image_id not in self.images:
            self.skipped.append(SkippedInput(where, f"names image {image_id!r:.60}, not listed"))
            return
        kind = "caption" if "caption" in note and "category_id" not in note else "instance"
        if self._repeated(path, where, kind, note):
            return
        if "segments_info" in note and "category_id" not in note:
            self.bad.setdefault(image_id, "a panoptic annotation (segments_info): not supported")
        if kind == "caption":
            self.has_captions = True
            if not isinstance(note["caption"], str):
                self.bad.setdefault(
                    image_id, f"annotation {note.get('id')!r:.40}: a caption that is not text"
                )
            self.captions.setdefault(image_id, []).append(note["caption"])
            return
        self.has_instances = True
        self.annotations.setdefault(image_id, []).append(note)

    def _repeated(self, path: str, where: str, kind: str, note: dict[str, Any]) -> bool:
        """Whether ``note`` repeats one already read (dropped, listed); a different one under
        the same id is refused."""
        if not _is_id(note.get("id")):
            return False
        first = self.notes.setdefault((kind, note["id"]), (path, note))
        if first[1] is note:
            return False
        if first[1] != note:
            raise SourceError(
                f"annotations {path!r}: {kind} annotation {note['id']} differs from the one "
                f"with that id in {first[0]!r}; ids must be unique"
            )
        self.skipped.append(
            SkippedInput(where, f"the same annotation as in {first[0]!r}: kept once")
        )
        return True

    def check_categories(self) -> None:
        """Mark every image one of whose annotations names an unlisted category."""
        for image_id, notes in self.annotations.items():
            for note in notes:
                cid = note.get("category_id")
                if not _is_id(cid) or cid not in self.categories:
                    self.bad.setdefault(
                        image_id,
                        f"annotation {note.get('id')!r:.40} names category {cid!r:.40}, which "
                        "the files do not list",
                    )
                    break


def _sample(root: str, image: dict[str, Any], merged: _Merged, source: str) -> FieldSample | str:
    """The sample of one image, or why it is skipped."""
    name = image["file_name"]
    try:
        inside_path(name, "file_name", "file_name {!r} is outside the image folder")
    except ValueError as exc:
        return str(exc)
    if image["id"] in merged.bad:
        return merged.bad[image["id"]]
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
        try:
            data = dumps_utf8(value, f"its {field}")
        except ValueError as exc:
            return str(exc)
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
        raise SourceError(f"no usable image in {str(root)!r}: {why_none(scan.skipped)}")
    scan.recorded = {
        "categories": [
            {k: c.get(k) for k in CATEGORY_KEYS if k in c}
            for _, c in sorted(merged.categories.items())
        ]
    }
    scan.inputs = [os.fspath(p) for p in annotations]
    return finish_scan(scan, samples, required, repr(str(root)), KINDS)
