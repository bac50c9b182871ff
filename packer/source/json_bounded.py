"""JSON read and written with its failures as reasons: a file opened without blocking (a FIFO
named as a file is refused, never waited on), nesting past the parser's depth, a string the
output cannot encode (a lone surrogate) — each a :class:`ValueError` saying why, never a
``RecursionError`` or ``UnicodeEncodeError`` out of a scan."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "INT64",
    "dumps_utf8",
    "inside_path",
    "loads_bounded",
    "plain_text",
    "read_regular",
    "text_value",
]

INT64 = (-(2**63), 2**63 - 1)  # what a reader gives back as an integer


def read_regular(path: str) -> bytes:
    """The bytes of regular file ``path``, opened without blocking.

    Raises:
        OSError: it cannot be opened or read, or is not a regular file (a FIFO, a device).
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(0, "not a regular file (a FIFO, socket or device is not read)")
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def loads_bounded(data: bytes | str) -> Any:
    """``data`` parsed as JSON.

    Raises:
        ValueError: it is not JSON, not UTF-8, or nests deeper than the parser goes.
    """
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deep (thousands of levels of lists or objects)") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc}") from None


def _default(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, datetime.timedelta):
        return str(value)
    raise TypeError(f"a {type(value).__name__} is not JSON")


def text_value(value: Any) -> Any:
    """A date, time or timestamp as its ISO text, a decimal as its decimal string, anything
    else as it is."""
    if isinstance(value, (datetime.date, datetime.time, decimal.Decimal, datetime.timedelta)):
        return _default(value)
    return value


def plain_text(text: str, what: str, nul: bool = False) -> bytes:
    """``text`` as UTF-8 (a NUL in it refused unless ``nul``: a path or a key cannot hold one).

    Raises:
        ValueError: it holds a NUL or a lone surrogate (no UTF-8 for it), ``what`` named.
    """
    if not nul and "\x00" in text:
        raise ValueError(f"{what} holds a NUL character")
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate (not UTF-8): {text[:60]!r}") from None


def inside_path(path: str, what: str, outside: str) -> None:
    """Refuse a record's path relative to its folder that cannot name a file inside it.

    Raises:
        ValueError: it holds a NUL or a lone surrogate (``what`` named: :func:`plain_text`),
            or is absolute or climbs out with ``..`` (``outside``, formatted with the path).
    """
    plain_text(path, what)
    if os.path.isabs(path) or ".." in Path(path).parts:
        raise ValueError(outside.format(path))


def dumps_utf8(value: Any, what: str) -> bytes:
    """``value`` as UTF-8 JSON (dates as ISO text, decimals as strings).

    Raises:
        ValueError: it holds a lone surrogate, nests too deep, or a value JSON cannot hold.
    """
    try:
        return json.dumps(value, ensure_ascii=False, default=_default).encode()
    except UnicodeEncodeError:
        raise ValueError(f"{what} holds a lone surrogate (not UTF-8)") from None
    except RecursionError:
        raise ValueError(f"{what} is nested too deep") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} cannot be stored as JSON: {exc}") from None
