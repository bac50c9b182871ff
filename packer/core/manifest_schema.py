"""The shape of ``packer.json``, checked field by field when a manifest is loaded.

Every field a reader, ``verify`` or ``inspect`` uses has a type and a range here; a manifest that
breaks one is refused with the field's place (``shards[2].bytes``), the value found and what was
expected, so a damaged or edited manifest never reaches code that would trip over it. The options
are declared and checked with their types in :mod:`packer.core.manifest_options`, on these checks.

Fields this packer does not know are ignored (and dropped by ``Manifest.from_dict``): a later
packer of the same layout version may add informational fields, and nothing here reads them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import xxhash

from packer.errors import FormatError

__all__ = [
    "FIELD_KINDS",
    "FIELD_NAME",
    "FORMAT_NAMES",
    "KINDS",
    "TABLE_NAMES",
    "Invalid",
    "MAX_MANIFEST_BYTES",
    "MAX_MANIFEST_SHARDS",
    "check_manifest",
    "check_manifest_size",
]

FORMAT_NAMES = ("bmp", "hdf5", "lmdb", "npy")  # the registry's names (a test keeps them equal)
KINDS = ("image", "video", "splits", "fields")
FIELD_KINDS = ("image", "text", "json", "int", "array", "audio", "bytes")
# a field name: lower-case letters, digits, "_", "-" and inner single dots, at most 64 characters
FIELD_NAME = re.compile(r"(?!.*\.\.)[a-z0-9_](?:[a-z0-9_.-]{0,62}[a-z0-9_-])?")
TABLE_NAMES = ("index.npy", "records.npy", "keys.txt")  # manifest.py's INDEX/RECORDS/KEYS_NAME
INT64_MAX = 2**63 - 1  # tables and readers hold counts, sizes and offsets as int64
_HEX64 = re.compile(r"[0-9a-f]{16}")
# Bounds on a manifest, checked before it is parsed (its bytes) and before its shards are built
# (their count): an ImageNet-scale output (1.28 M samples, ~1,000 shards, thousands skipped)
# writes ~2 MB. docs/reliability.md states them.
MAX_MANIFEST_BYTES = 64 << 20
MAX_MANIFEST_SHARDS = 200_000


def check_manifest_size(path: str, size: int) -> None:
    """A manifest of ``size`` bytes at ``path`` is within :data:`MAX_MANIFEST_BYTES`.

    Raises:
        FormatError: it is larger (refused before it is read whole or parsed).
    """
    if size > MAX_MANIFEST_BYTES:
        raise FormatError(
            f"{path!r} is {size:,} bytes, over the {MAX_MANIFEST_BYTES:,} a packer manifest may "
            "hold: it was damaged or not written by packer; convert the source again"
        )


class Invalid(FormatError):
    """One field breaks the schema: where it is, the value found, what was expected
    (:meth:`packer.core.manifest.Manifest.from_dict` says which file too)."""

    def __init__(self, where: str, found: Any, expected: str) -> None:
        shown = "missing" if found is _MISSING else _short(found)
        super().__init__(f"{where} is {shown}; expected {expected}")


_MISSING = object()
MISSING = _MISSING  # a required field that is not there (Invalid says "missing")
Check = Callable[[Any, str], None]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def integer(low: int = 0, high: int = INT64_MAX) -> Check:
    """An int (not a bool) in ``low..high``."""

    def check(value: Any, where: str) -> None:
        if type(value) is not int or not low <= value <= high:
            raise Invalid(where, value, f"an integer in {low}..{high}")

    return check


def number(value: Any, where: str) -> None:
    """A finite, non-negative int or float."""
    if type(value) not in (int, float) or not math.isfinite(value) or value < 0:
        raise Invalid(where, value, "a finite number >= 0")


def boolean(value: Any, where: str) -> None:
    """``true`` or ``false``."""
    if type(value) is not bool:
        raise Invalid(where, value, "true or false")


def text(
    choices: tuple[str, ...] = (),
    pattern: re.Pattern[str] | None = None,
    expected: str = "16 lowercase hex digits (an xxh3_64 checksum)",
) -> Check:
    """A string, one of ``choices`` or matching ``pattern`` (described by ``expected``)."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, str):
            raise Invalid(where, value, "a string")
        if choices and value not in choices:
            raise Invalid(where, value, "one of " + ", ".join(map(repr, choices)))
        if pattern is not None and not pattern.fullmatch(value):
            raise Invalid(where, value, expected)

    return check


def optional(inner: Check) -> Check:
    """``null`` or what ``inner`` accepts."""

    def check(value: Any, where: str) -> None:
        if value is not None:
            inner(value, where)

    return check


def list_of(item: Check, length: int | None = None, unique: bool = False) -> Check:
    """A list whose items ``item`` accepts (``length`` of them; no repeats with ``unique``)."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, list) or (length is not None and len(value) != length):
            raise Invalid(where, value, f"a list of {length} items" if length else "a list")
        for i, x in enumerate(value):
            item(x, f"{where}[{i}]")
        if unique and len(set(value)) != len(value):
            raise Invalid(where, value, "a list without repeated names")

    return check


def mapping(values: Check) -> Check:
    """An object of non-empty names to values ``values`` accepts."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(where, value, "an object")
        for name, x in value.items():
            if not name:
                raise Invalid(where, name, "non-empty names")
            values(x, f"{where}.{name}")

    return check


def record(fields: dict[str, Check], required: tuple[str, ...] = ()) -> Check:
    """An object whose known ``fields`` are checked (``required`` ones must be there); other
    fields are ignored."""

    def check(value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise Invalid(where or "the manifest", value, "an object")
        prefix = f"{where}." if where else ""
        for name in required:
            if name not in value:
                raise Invalid(prefix + name, _MISSING, "a value (the field is required)")
        for name, inner in fields.items():
            if name in value:
                inner(value[name], prefix + name)

    return check


COUNT = integer()
SIDE = optional(integer(1))
SHARD = record(
    {"name": text(), "samples": COUNT, "bytes": COUNT, "xxh3_64": text(pattern=_HEX64)},
    required=("name", "samples", "bytes", "xxh3_64"),
)
SKIPPED = record({"path": text(), "reason": text()}, required=("path", "reason"))
RESIZE_FIELDS = {
    "quality": integer(1, 100),
    "max_side": SIDE,
    "short_side": SIDE,
    "reencode": boolean,
}
RESIZE = record(RESIZE_FIELDS, required=tuple(RESIZE_FIELDS))
SOURCE = record(
    {
        "root": optional(text()),
        "files": COUNT,
        "bytes": COUNT,
        "videos": COUNT,
        "video_files": COUNT,
        "frame_folders": COUNT,
        "splits": list_of(text()),
    }
)
_FIELDS: dict[str, Check] = {
    "format": text(FORMAT_NAMES),
    "kind": text(KINDS),
    "num_samples": COUNT,
    "classes": list_of(text(), unique=True),
    "shards": list_of(SHARD),
    "skipped": list_of(SKIPPED),
    "source": SOURCE,
    "options": record({}),  # each option: packer.core.manifest_options
    "files": mapping(text(pattern=_HEX64)),
    "layout_version": integer(1),
    "packer_version": text(),
    "created": text(),
}
MANIFEST = record(_FIELDS, required=tuple(_FIELDS))


def check_manifest(data: Any) -> None:
    """Check a parsed ``packer.json`` against the schema.

    Raises:
        Invalid: the first field that breaks it (over MAX_MANIFEST_SHARDS shards: before any
            shard entry is checked).
    """
    shards = data.get("shards") if isinstance(data, dict) else None
    if isinstance(shards, list) and len(shards) > MAX_MANIFEST_SHARDS:
        raise Invalid("shards", f"a list of {len(shards):,}", f"at most {MAX_MANIFEST_SHARDS:,}")
    MANIFEST(data, "")
    if data["kind"] == "splits":
        return
    for name in TABLE_NAMES:
        if name not in data["files"]:
            raise Invalid(f"files.{name}", _MISSING, "the table's xxh3_64 checksum")


# What a reader trusts without a table to check it against: the checksum a manifest carries over
# them (its top-level trusted_xxh3_64) catches a flipped byte in a class, field or category name.
TRUSTED_OPTIONS = ("layout", "kind", "fields", "categories", "splits")
TRUSTED = ("format", "kind", "classes", "num_samples")


def trusted_digest(data: dict[str, Any]) -> str:
    """The xxh3 of the parts of a manifest's JSON a reader trusts: format, kind, classes and
    sample count, and the options' layout, kind, fields, categories and splits."""
    options = data.get("options") or {}
    parts = {name: data.get(name) for name in TRUSTED}
    parts["options"] = {name: options.get(name) for name in TRUSTED_OPTIONS}
    canonical = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return xxhash.xxh3_64(canonical.encode("ascii")).hexdigest()


def check_trusted(data: dict[str, Any], where: str) -> None:
    """Refuse a manifest whose trusted parts do not match the checksum it carries (one written
    before the checksum existed carries none).

    Raises:
        FormatError: naming the manifest and what no longer matches.
    """
    expected = data.get("trusted_xxh3_64")
    if expected is not None and expected != trusted_digest(data):
        raise FormatError(
            f"{where} is damaged or was edited: its classes, fields, categories, splits or "
            "sample count no longer match the checksum written with them "
            "(trusted_xxh3_64); refusing to read it. Restore it or convert again"
        )
