"""The options a manifest records (``packer.json``'s ``options``), typed and checked in one place.

Every option a conversion writes and a reader, ``verify`` or ``inspect`` uses is one field of
:class:`ManifestOptions` below: its type, its default (what an output that does not record it
means: a manifest without ``layout`` is sharded) and its schema check, declared once. A manifest is
parsed into it when it is loaded (:meth:`packer.core.manifest.Manifest.from_dict`), so a wrong
type or value is refused there, naming the option (``options.layout is 7; expected one of
'shards', 'per-sample'``) and the file, and no reader trips over it later.

The manifest keeps the options as found too (``Manifest.options``, written back byte for byte):
an option this packer does not know, from a newer or an older packer, loads, is kept in
:attr:`ManifestOptions.unknown` and round-trips.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from packer.core.manifest_schema import (
    COUNT,
    FIELD_KINDS,
    FIELD_NAME,
    MISSING,
    RESIZE,
    SIDE,
    Check,
    Invalid,
    boolean,
    integer,
    list_of,
    mapping,
    number,
    optional,
    record,
    text,
)

__all__ = ["LAYOUTS", "Category", "FieldSpec", "ManifestOptions", "Resized", "parse_options"]

LAYOUTS = ("shards", "per-sample")


@dataclass(frozen=True)
class FieldSpec:
    """One field of a dataset: its name (``jpg``, ``seg.png``, ``txt``) and its kind."""

    name: str
    kind: str

    def to_dict(self) -> dict[str, str]:
        """The manifest's entry."""
        return {"name": self.name, "kind": self.kind}


class Category(NamedTuple):
    """One COCO category a dataset of fields records: its id and its name."""

    id: int
    name: str


@dataclass(frozen=True)
class Resized:
    """How the images were resized at conversion (``--short-side``/``--max-side``/...)."""

    quality: int
    max_side: int | None
    short_side: int | None
    reencode: bool


def _names(values: Check) -> Check:
    """An object (any names, an empty one too) whose values ``values`` accepts."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(where, value, "an object")
        for name, x in value.items():
            values(x, f"{where}.{name}")

    return check


_FIELD = record(
    {"name": text(pattern=FIELD_NAME, expected="a plain field name"), "kind": text(FIELD_KINDS)},
    required=("name", "kind"),
)
_CATEGORY = record({"id": integer(), "name": text()}, required=("id", "name"))


def _option(check: Check, default: Any = None, convert: Callable[[Any], Any] | None = None) -> Any:
    """One option: its schema ``check``, its ``default`` when the manifest does not record it,
    and how its JSON value becomes the typed one (``convert``; none: as it is)."""
    meta = {"check": check, "convert": convert}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ManifestOptions:
    """A manifest's options, typed: each one its type, its default and its check."""

    # how the data files are laid out: shards of many records, or one file per sample
    layout: str = _option(text(LAYOUTS), "shards")
    shard_size: int | None = _option(COUNT)
    check: str | None = _option(text())  # the scan check of the inputs
    max_file_size: int | None = _option(COUNT)
    max_pixels: int | None = _option(COUNT)
    storage: Mapping[str, float] = _option(mapping(number), {})  # bytes of records, on disk
    # decoded pixels (--size): [H, W, 3] uint8 per sample
    pixels: tuple[int, int, int] | None = _option(list_of(integer(1), length=3), None, tuple)
    resize: Resized | None = _option(RESIZE, None, lambda r: Resized(**r))
    # video: the frames' encoding and sampling
    quality: int | None = _option(optional(integer(1, 100)))
    max_side: int | None = _option(SIDE)
    short_side: int | None = _option(SIDE)
    fps: float | None = _option(optional(number))
    skip_bad_frames: bool | None = _option(optional(boolean))
    # a root of splits: each split's samples, where the class index came from, its splits' kind
    splits: Mapping[str, int] = _option(mapping(COUNT), {})
    class_index_from: str | None = _option(text())
    class_index: Mapping[str, str] = _option(_names(text()), {})
    kind: str | None = _option(text(("image", "video", "fields")))
    # a part of a conversion split across machines: [number, of], and its shards planned
    part: tuple[int, int] | None = _option(list_of(COUNT, length=2), None, tuple)
    planned_shards: int | None = _option(COUNT)
    # samples with fields: the fields in record order, COCO's categories, where they came from
    fields: tuple[FieldSpec, ...] = _option(
        list_of(_FIELD), (), lambda fs: tuple(FieldSpec(f["name"], f["kind"]) for f in fs)
    )
    categories: tuple[Category, ...] = _option(
        list_of(_CATEGORY), (), lambda cs: tuple(Category(c["id"], c["name"]) for c in cs)
    )
    source_kind: str | None = _option(text())
    follow_links: bool | None = _option(boolean)
    jpeg_quality: int | None = _option(optional(integer(1, 100)))  # packer.Writer / packer.pack
    hf_features: Mapping[str, str] = _option(_names(text()), {})  # a Hugging Face source's
    class_names: Mapping[str, list[str]] = _option(_names(list_of(text())), {})
    hf_left_out: Mapping[str, str] = _option(_names(text()), {})
    # options this packer does not know (a newer or older packer's), as found
    unknown: Mapping[str, Any] = field(default_factory=dict)

    @property
    def field_names(self) -> list[str]:
        """The fields' names, in record order."""
        return [f.name for f in self.fields]


DECLARED = tuple(f.name for f in fields(ManifestOptions) if f.name != "unknown")


def parse_options(raw: Any, kind: str | None) -> ManifestOptions:
    """The typed options of a manifest of ``kind`` whose ``options`` are ``raw`` (parsed JSON);
    ``kind`` None: only their types and values are checked, not what a kind needs.

    Raises:
        Invalid: the first option of the wrong type or value (``options.NAME``), or one a
            manifest of ``kind`` needs and lacks.
    """
    if not isinstance(raw, dict):
        raise Invalid("options", raw, "an object")
    values: dict[str, Any] = {}
    for f in fields(ManifestOptions):
        if f.name in raw and f.name != "unknown":
            value = raw[f.name]
            f.metadata["check"](value, f"options.{f.name}")
            convert = f.metadata["convert"]
            values[f.name] = convert(value) if convert and value is not None else value
    if kind == "splits" and "splits" not in raw:
        raise Invalid("options.splits", MISSING, "the splits of a manifest of kind 'splits'")
    if kind == "fields":
        names = [f.name for f in values.get("fields", ())]
        if not names or len(set(names)) != len(names):
            raise Invalid("options.fields", names, "one or more fields with distinct names")
    if kind not in (None, "splits") and "layout" not in raw:
        raise Invalid("options.layout", MISSING, "one of " + ", ".join(map(repr, LAYOUTS)))
    unknown = {k: v for k, v in raw.items() if k not in DECLARED}
    return ManifestOptions(**values, unknown=unknown)
