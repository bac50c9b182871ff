"""A value handed to :class:`packer.Writer`, as the bytes its field stores: by the field's kind.

The field's name decides its kind (:func:`packer.core.fields.field_kind`), as for key-grouped
files, and the kind which values it takes:

- every kind: ``bytes`` (``bytearray``, ``memoryview``), stored unchanged once checked by the
  kind as a conversion checks a file (:func:`packer.decode.values.check_value`, at the
  writer's ``check``: :data:`Check`);
- ``text``: a ``str`` (stored as UTF-8);
- ``int``: an ``int`` or a numpy integer within int64 (stored as its decimal digits);
- ``json``: a ``dict`` or a ``list`` that reads back equal (no tuple, no key that is not a
  ``str``, no NaN);
- ``array``: a numpy array, a numpy scalar or a torch tensor of a numeric dtype (bool,
  integers, floats, complex), any shape, stored as ``.npy`` (read back equal in dtype, shape
  and values);
- ``image``: a PIL image, or a uint8 array H×W or H×W×C (C 1, 3 or 4), encoded by the field's
  suffix: ``png``, ``webp`` (lossless), ``bmp``, ``tif``/``tiff`` losslessly, ``jpg``/``jpeg``
  at ``jpeg_quality``;
- ``bytes``: bytes only.

Anything else is refused with the reason (:class:`packer.errors.InputFileError`): the caller
names the sample and the field.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, Literal, TypedDict, cast

import numpy as np
from PIL import Image

from packer.core.contained import check_relative
from packer.core.fields import MAX_FIELDS, FieldSpec, check_field_name, field_kind
from packer.decode import check as _check
from packer.decode.check import CHECKS, DEFAULT_MAX_PIXELS
from packer.decode.values import check_value
from packer.errors import InputFileError, PackerError

__all__ = [
    "DEFAULT_CHECK",
    "DEFAULT_JPEG_QUALITY",
    "MAX_RECORD",
    "Check",
    "WriterOptions",
    "check_check",
    "check_jpeg_quality",
    "declared_fields",
    "encode_fields",
    "encode_value",
    "sample_key",
]

# How the bytes given for a field are checked: ``packer convert --check``'s levels, the same
# meaning (packer.decode.check.check_image): "fast" the header and a JPEG's end marker, "scan"
# (the default) also the whole compressed stream (a 1/8-scale decode), "decode" a full decode.
Check = Literal["fast", "scan", "decode"]
DEFAULT_CHECK = cast(Check, _check.DEFAULT_CHECK)  # convert's default, "scan"
DEFAULT_JPEG_QUALITY = 90


class WriterOptions(TypedDict, total=False):
    """The keywords of :class:`packer.write.writer.Writer` (documented there), as one typed
    object: the URL writer (:mod:`packer.upload.url_writer`) takes and passes them on as they
    are, so the two keyword lists cannot drift apart."""

    fields: Iterable[str] | None
    shard_size: int | str
    overwrite: bool
    storage_options: dict[str, Any] | None
    jpeg_quality: int
    check: Check
    progress: bool


MAX_RECORD = (1 << 32) - 1  # records.npy holds a record's length as <u4
_INT64 = (-(1 << 63), (1 << 63) - 1)
_NUMERIC = "biufc"  # numpy dtype kinds: bool, signed, unsigned, float, complex
_IMAGE_FORMATS = {
    "png": "PNG",
    "jpg": "JPEG",
    "jpeg": "JPEG",
    "webp": "WEBP",
    "bmp": "BMP",
    "tif": "TIFF",
    "tiff": "TIFF",
}
_TAKES = {
    "text": "a str",
    "int": "an int",
    "json": "a dict or a list",
    "array": "a numpy array or a torch tensor",
    "image": "a PIL image or a uint8 array (H×W or H×W×C)",
    "audio": "the bytes of an audio file (.wav, .flac, ...)",
    "bytes": "bytes",
}


def check_check(check: Any) -> Check:
    """``check`` if it is one of :data:`Check`'s levels.

    Raises:
        PackerError: naming the value given and the levels (as ``convert`` says it).
    """
    if not isinstance(check, str) or check not in CHECKS:
        raise PackerError(f"invalid check {check!r}; expected one of {', '.join(CHECKS)}")
    return check  # type: ignore[return-value]  # one of CHECKS, the levels Check lists


def check_jpeg_quality(quality: Any) -> int:
    """``quality`` if it is a JPEG quality (an int from 1 to 100).

    Raises:
        InputFileError: saying what was given.
    """
    if isinstance(quality, bool) or not isinstance(quality, int) or not 1 <= quality <= 100:
        raise InputFileError(f"invalid jpeg_quality {quality!r}; expected an int from 1 to 100")
    return quality


def declared_fields(fields: Iterable[str] | None) -> dict[str, FieldSpec] | None:
    """The fields ``Writer(fields=...)`` declares, by name (None: not declared).

    Raises:
        PackerError: not a list of 1 to MAX_FIELDS distinct plain names.
    """
    if fields is None:
        return None
    if isinstance(fields, str):
        raise PackerError(f"fields={fields!r}: give a list of field names, e.g. ['jpg', 'txt']")
    names = [check_field_name(n, "fields=") for n in fields]
    if not names or len(set(names)) != len(names) or len(names) > MAX_FIELDS:
        raise PackerError(f"fields={names!r}: expected 1 to {MAX_FIELDS} distinct field names")
    return {n: FieldSpec(n, field_kind(n)) for n in names}


def _tensor(value: Any) -> np.ndarray | None:
    """A torch tensor's values as a numpy array (None: not a tensor); torch is never imported
    here: a tensor exists only once its user imported it."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    try:
        return value.detach().cpu().resolve_conj().resolve_neg().numpy()
    except (TypeError, RuntimeError) as exc:
        raise InputFileError(
            f"a torch tensor of dtype {value.dtype} has no numpy equivalent ({exc}); convert it "
            "first (tensor.float(), tensor.to_dense())"
        ) from None


def _array(value: Any) -> bytes:
    array = _tensor(value)
    if array is None and isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value)
    if array is None:
        raise _refused("array", value)
    if array.dtype.kind not in _NUMERIC:
        raise InputFileError(
            f"an array of dtype {array.dtype}; expected a numeric dtype (bool, integers, "
            "floats, complex)"
        )
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def _int(value: Any) -> bytes:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer):
        raise _refused("int", value)
    number = int(value)
    if not _INT64[0] <= number <= _INT64[1]:
        raise InputFileError(f"the integer {number} is beyond int64 (what the field reads into)")
    return str(number).encode()


def _text(value: Any) -> bytes:
    if not isinstance(value, str):
        raise _refused("text", value)
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputFileError(
            f"not encodable as UTF-8 (character {exc.start} is a lone surrogate)"
        ) from None


def _json(value: Any) -> bytes:
    if not isinstance(value, dict | list):
        raise _refused("json", value)
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputFileError(f"not JSON: {exc}") from None
    if json.loads(text) != value:
        raise InputFileError(
            "would not read back equal as JSON (a tuple, or a dict key that is not a str?); "
            "pass lists and str keys"
        )
    return _text(text)


def _pixels(value: Any) -> Image.Image:
    """A PIL image of ``value`` (a PIL image, or a uint8 H×W / H×W×C array)."""
    if isinstance(value, Image.Image):
        return value
    if not isinstance(value, np.ndarray):
        raise _refused("image", value)
    shape = value.shape
    channels = shape[2] if value.ndim == 3 else 1
    if value.dtype != np.uint8 or value.ndim not in (2, 3) or channels not in (1, 3, 4):
        raise InputFileError(
            f"an array of dtype {value.dtype} and shape {shape}; an image field takes uint8 "
            "pixels H×W or H×W×C (C 1, 3 or 4)"
        )
    if 0 in shape:
        raise InputFileError(f"an image with no pixels (shape {shape})")
    plane = value[:, :, 0] if value.ndim == 3 and channels == 1 else value
    return Image.fromarray(np.ascontiguousarray(plane))


def _image(value: Any, suffix: str, quality: int) -> bytes:
    image = _pixels(value)
    fmt = _IMAGE_FORMATS.get(suffix)
    if fmt is None:
        raise InputFileError(
            f"pixels are not encoded as .{suffix} here; pass the encoded bytes, or name the "
            f"field by one of {', '.join(sorted(_IMAGE_FORMATS))}"
        )
    if fmt == "JPEG" and image.mode not in ("L", "RGB", "CMYK"):
        raise InputFileError(
            f"JPEG cannot hold an image of mode {image.mode!r} (an alpha channel?); convert it "
            "to RGB or L, or name the field .png"
        )
    choices: dict[str, dict[str, Any]] = {"JPEG": {"quality": quality}, "WEBP": {"lossless": True}}
    options = choices.get(fmt, {})
    buffer = io.BytesIO()
    try:
        image.save(buffer, format=fmt, **options)
    except (OSError, ValueError, KeyError) as exc:
        raise InputFileError(f"cannot be encoded as .{suffix}: {exc}") from None
    return buffer.getvalue()


def _refused(kind: str, value: Any) -> InputFileError:
    return InputFileError(
        f"a field of kind {kind!r} takes {_TAKES[kind]} (or its encoded bytes), not "
        f"{type(value).__module__}.{type(value).__qualname__}".replace("builtins.", "")
    )


def encode_value(
    value: Any,
    spec: FieldSpec,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
    check: Check = DEFAULT_CHECK,
) -> bytes:
    """The bytes field ``spec`` stores for ``value`` (see the module's docstring); bytes given
    are checked at ``check`` (:func:`packer.decode.values.check_value`).

    Raises:
        InputFileError: a value the field's kind cannot take, with the reason.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        data = value if type(value) is bytes else bytes(value)  # bytes as given: no copy
        if spec.kind != "bytes":
            check_value(data, spec.kind, check, DEFAULT_MAX_PIXELS)
    elif spec.kind == "text":
        data = _text(value)
    elif spec.kind == "int":
        data = _int(value)
    elif spec.kind == "json":
        data = _json(value)
    elif spec.kind == "array":
        data = _array(value)
    elif spec.kind == "image":
        data = _image(value, spec.name.rsplit(".", 1)[-1], jpeg_quality)
    else:
        raise _refused(spec.kind if spec.kind == "audio" else "bytes", value)
    if len(data) > MAX_RECORD:
        raise InputFileError(f"{len(data)} bytes, over the largest record ({MAX_RECORD} bytes)")
    return data


@lru_cache(maxsize=1024)
def _spec_of(name: str) -> FieldSpec:
    """The spec of an undeclared field ``name``, its name checked (cached: a writer meets the
    same few names in every sample; a bad name raises, and is not cached)."""
    return FieldSpec(check_field_name(name), field_kind(name))


def encode_fields(
    key: str,
    sample: Mapping[str, Any],
    declared: dict[str, FieldSpec] | None,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
    check: Check = DEFAULT_CHECK,
) -> dict[str, bytes]:
    """Every field of ``sample`` but ``__key__`` as the bytes it stores, in the sample's order.

    The same in any process (``packer.pack`` encodes in its workers): it depends only on the
    sample, the ``declared`` fields (None: any plain name, its kind by its suffix), the
    quality and the ``check``.

    Raises:
        InputFileError: naming ``key`` and the field: a name that is not plain or not declared,
            a ``None`` value, a value the field's kind cannot take, or no field at all.
    """
    encoded: dict[str, bytes] = {}
    for name, value in sample.items():
        if name == "__key__":
            continue
        try:
            spec = declared[name] if declared is not None and name in declared else _spec_of(name)
        except PackerError as exc:
            raise InputFileError(f"sample {key!r}: {exc}") from None
        if declared is not None and name not in declared:
            raise InputFileError(
                f"sample {key!r}, field {name!r}: not one of the fields declared "
                f"({', '.join(sorted(declared))})"
            )
        if value is None:
            raise InputFileError(
                f"sample {key!r}, field {name!r}: None; leave the field out of the sample to "
                "mark it absent"
            )
        try:
            encoded[name] = encode_value(value, spec, jpeg_quality, check)
        except PackerError as exc:
            raise InputFileError(f"sample {key!r}, field {name!r} ({spec.kind}): {exc}") from None
    if not encoded:
        raise InputFileError(f"sample {key!r} has no field besides '__key__'")
    return encoded


def sample_key(sample: Any, number: int) -> str:
    """The ``__key__`` of ``sample`` (the ``number``-th given), checked: a dict's plain relative
    name, encodable as UTF-8.

    Raises:
        InputFileError: naming the sample (by its key, else its number) and what is wrong.
    """
    if not isinstance(sample, Mapping):
        raise InputFileError(
            f"sample {number} is a {type(sample).__name__}, not a dict of fields with its '__key__'"
        )
    if "__key__" not in sample:
        raise InputFileError(f"sample {number}, field '__key__': missing")
    key = sample["__key__"]
    try:
        check_relative(key, "key")
        key.encode("utf-8")
    except (PackerError, UnicodeEncodeError) as exc:
        why = exc if isinstance(exc, PackerError) else "not encodable as UTF-8"
        raise InputFileError(f"sample {key!r}, field '__key__': {why}") from None
    return key
