"""Samples with named fields: a field's name, its kind, and how an absent field is stored.

A dataset of kind ``"fields"`` stores each sample as a run of one record per field, in the order
the manifest's ``options.fields`` lists them (``[{"name": "jpg", "kind": "image"}, ...]``). A
field a sample does not have is a record of length 0 whose checksum is :data:`ABSENT` (0): the
xxh3 of zero bytes is not 0, so an empty caption (present, ``""``) and a missing one stay
apart, and ``verify`` accepts exactly that pair (:func:`record_matches`).

A field's kind follows from the last part of its name, as WebDataset names them
(``jpg``, ``seg.png``, ``txt``, ``json``, ``cls``, ``npy``; ``wav``, ``flac``, ``audio``: a clip);
anything else is ``bytes``.
"""

from __future__ import annotations

from packer.core.manifest import bytes_checksum
from packer.core.manifest_options import FieldSpec  # declared with the options that list them
from packer.core.manifest_schema import FIELD_KINDS, FIELD_NAME
from packer.errors import SourceError

__all__ = [
    "ABSENT",
    "AUDIO_SUFFIXES",
    "FIELD_KINDS",
    "MAX_FIELDS",
    "FieldSpec",
    "check_field_name",
    "field_kind",
    "kind_noun",
    "record_matches",
]

ABSENT = 0  # the checksum of a field the sample does not have (its record holds no bytes)
MAX_FIELDS = 256  # fields one dataset may have: more is a source that is not what it seems
AUDIO_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a")  # clips, any case
_BY_SUFFIX = {
    **{
        s: "image"
        for s in ("jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm", "pbm")
    },
    **{s: "text" for s in ("txt", "text", "caption")},
    "json": "json",
    **{s: "int" for s in ("cls", "cls2", "index", "label")},
    "npy": "array",
    **{s: "audio" for s in ("audio", *(a[1:] for a in AUDIO_SUFFIXES))},
}


def check_field_name(name: str, where: str = "") -> str:
    """``name`` if it is a plain field name: lower-case letters, digits, ``_``, ``-`` and inner
    dots, at most 64 characters, not starting with ``__`` (``__key__`` names the sample's key).

    Raises:
        SourceError: naming ``where`` and the name.
    """
    if not isinstance(name, str) or not FIELD_NAME.fullmatch(name) or name.startswith("__"):
        at = f" in {where}" if where else ""
        raise SourceError(
            f"field name {name!r}{at} is not a plain name (lower-case letters, digits, '_', "
            "'-' and inner dots, at most 64 characters)"
        )
    return name


def field_kind(name: str) -> str:
    """The kind of field ``name``, from its last dot-separated part (``seg.png`` is an image)."""
    return _BY_SUFFIX.get(name.rsplit(".", 1)[-1], "bytes")


def record_matches(data: bytes | memoryview, digest: int) -> bool:
    """Whether a record's bytes match its recorded checksum (an absent field: no bytes, 0)."""
    if digest == ABSENT:
        return len(data) == 0
    return bytes_checksum(data) == digest


def kind_noun(kind: str) -> str:
    """What a dataset of ``kind`` holds, for messages: ``images``, ``videos``, ``samples with
    fields``."""
    return {"fields": "samples with fields", "splits": "splits"}.get(kind, f"{kind}s")
