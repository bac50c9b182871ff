"""A field's bytes checked (at conversion, by ``verify``) and decoded (at read) by its kind.

Kinds (:data:`packer.core.fields.FIELD_KINDS`): ``image`` (checked like every image, decoded to
the dataset's ``output``), ``text`` (UTF-8, a ``str``), ``json`` (parsed), ``int`` (a decimal
integer, ``cls``), ``array`` (an ``.npy`` array, never of Python objects), ``audio`` (a clip,
:mod:`packer.decode.audio`: ``(waveform, sample_rate)``), ``bytes`` (as stored).
"""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from packer.decode.audio import AudioOptions, check_audio, decode_audio
from packer.decode.check import check_image
from packer.decode.outputs import decode
from packer.errors import InputFileError

__all__ = ["check_value", "decode_value"]


def _text(data: bytes | memoryview) -> str:
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = bytes(data)[exc.start]
        raise InputFileError(f"not UTF-8 text (byte {exc.start} is {bad:#04x})") from None


def _json(data: bytes | memoryview) -> Any:
    try:
        return json.loads(_text(data))
    except ValueError as exc:
        raise InputFileError(f"not JSON: {exc}") from None


def _int(data: bytes | memoryview) -> int:
    text = _text(data)
    try:
        return int(text.strip())
    except ValueError:
        raise InputFileError(f"not an integer: {text[:40]!r}") from None


def _array_header(buffer: io.BytesIO, size: int) -> None:
    try:
        version = npformat.read_magic(buffer)
        if version == (1, 0):
            shape, _, dtype = npformat.read_array_header_1_0(buffer)
        else:
            shape, _, dtype = npformat.read_array_header_2_0(buffer)
    except (ValueError, OSError) as exc:
        raise InputFileError(f"not an .npy array: {exc}") from None
    if dtype.hasobject:
        raise InputFileError("an .npy array of Python objects (refused: loading it runs code)")
    need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size - buffer.tell() != need:
        raise InputFileError(f"a truncated .npy array ({size - buffer.tell()} of {need} bytes)")


def _array(data: bytes | memoryview) -> np.ndarray:
    buffer = io.BytesIO(bytes(data))
    _array_header(buffer, len(data))
    buffer.seek(0)
    return np.load(buffer, allow_pickle=False)


def check_value(data: bytes, kind: str, check: str = "fast", max_pixels: int = 0) -> None:
    """Raise :class:`InputFileError`, with the reason, unless ``data`` is a sound ``kind``
    (``check`` and ``max_pixels``: the image check's, :func:`packer.decode.check.check_image`)."""
    if kind == "image":
        if max_pixels:
            check_image(data, check, max_pixels)
        else:
            check_image(data, check)
    elif kind == "text":
        _text(data)
    elif kind == "json":
        _json(data)
    elif kind == "int":
        _int(data)
    elif kind == "array":
        _array_header(io.BytesIO(data), len(data))
    elif kind == "audio":
        check_audio(data, check)


def decode_value(
    data: bytes | memoryview,
    kind: str,
    output: str = "pil",
    decoder: str = "auto",
    audio: AudioOptions | None = None,
) -> Any:
    """The value of a field's bytes: an image in ``output`` (``"bytes"``: every kind as
    stored), a ``str``, a parsed JSON value, an ``int``, a numpy array, an audio clip's
    ``(waveform, sample_rate)`` (decoded by ``audio``'s options), or ``bytes``.

    Raises:
        InputFileError: bytes that are not a sound value of ``kind``.
    """
    if output == "bytes" or kind == "bytes":
        return bytes(data)
    if kind == "image":
        try:
            return decode(data, output, decoder)
        except (OSError, ValueError, SyntaxError) as exc:
            raise InputFileError(f"cannot be decoded: {exc}") from exc
    if kind == "text":
        return _text(data)
    if kind == "json":
        return _json(data)
    if kind == "int":
        return _int(data)
    if kind == "array":
        return _array(data)
    if kind == "audio":
        return decode_audio(data, output, audio)
    return bytes(data)
