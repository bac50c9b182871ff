"""Human-readable byte sizes: parse "512MiB" / "1GB" and format 1234567 as "1.2 MB"; the bounds of
a remote request (seconds, bytes/s) read from storage options or the environment."""

from __future__ import annotations

import os
import re

from packer.errors import PackerError

__all__ = [
    "BOUNDS",
    "WHOLE",
    "bounds",
    "bounds_hint",
    "deadline",
    "format_size",
    "parse_size",
    "read_advice",
]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse a byte size such as ``"16MB"``, ``"512MiB"``, ``"1GB"`` or ``1048576``.

    Decimal units (kB, MB, GB) are powers of 1000, binary units (KiB, MiB, GiB) powers of 1024.

    Raises:
        PackerError: the text is not a positive size.
    """
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(text)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise PackerError(
                f"invalid size {text!r}; expected a number with an optional unit "
                "such as 16MB, 512MiB or 1GB"
            )
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise PackerError(f"invalid size {text!r}; it must be greater than zero")
    return value


def format_size(num_bytes: float) -> str:
    """Format a byte count with a decimal unit: ``format_size(1234567) == "1.2 MB"``."""
    value = float(num_bytes)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


# Every remote request's bounds (packer's storage options, else $PACKER_<NAME>, else these): a
# connection opened within connect_timeout s; no wait for a byte past read_timeout s; an attempt
# moving n bytes ends within connect_timeout + read_timeout + n / min_rate s (a body trickled
# slower than min_rate bytes/s is cut and tried again). A slow but working link never hits them.
BOUNDS = {"connect_timeout": 10.0, "read_timeout": 30.0, "min_rate": 32_000.0}
WHOLE = 4 << 20  # the bytes an attempt is bounded for when the object's size is not known


def bounds(options: dict[str, object]) -> dict[str, float]:
    """The request bounds :data:`BOUNDS` names, from ``options``, the environment or defaults
    (``min_rate`` also as a size: ``"32kB"`` a second).

    Raises:
        PackerError: a bound that is not a number above 0.
    """
    out = {}
    for name, default in BOUNDS.items():
        env = f"PACKER_{name.upper()}"
        given = options.get(name, os.environ.get(env) or default)
        try:
            out[name] = float(given)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            out[name] = -1.0
            if name == "min_rate" and isinstance(given, str) and _SIZE_RE.match(given):
                out[name] = float(parse_size(given))
        if not out[name] > 0:
            raise PackerError(
                f"storage option {name} is {given!r}; expected a number above 0 "
                f"(--storage-option {name}=NUMBER or ${env}; default {default:g})"
            )
    return out


def deadline(limits: dict[str, float], nbytes: int | None = None) -> float:
    """The seconds one attempt moving ``nbytes`` may take (None: unknown, :data:`WHOLE`)."""
    n = WHOLE if nbytes is None else nbytes
    return limits["connect_timeout"] + limits["read_timeout"] + n / limits["min_rate"]


def bounds_hint(limits: dict[str, float], exc: BaseException) -> str:
    """For a request that timed out (``exc``): the bounds ``limits`` and how to raise them."""
    if "timeout" not in f"{type(exc).__name__} {exc} {exc.__cause__}".lower():
        return ""
    return (
        f" (each attempt is bounded: connect_timeout={limits['connect_timeout']:g}s, "
        f"read_timeout={limits['read_timeout']:g}s without a byte, min_rate="
        f"{limits['min_rate']:g} bytes/s; for a slower store raise them, e.g. --storage-option "
        "read_timeout=120 or $PACKER_READ_TIMEOUT)"
    )


def read_advice(limits: dict[str, float], exc: BaseException) -> str:
    """What to do after a read failed every attempt, the last with ``exc``."""
    if "range request" in str(exc).lower():
        return (
            "The server must support Range requests (HTTP 206 Partial Content): packer reads "
            "records by byte ranges; serve the dataset from one that does (S3, nginx, most CDNs)"
        )
    return (
        "The store is unreachable, overloaded or throttling: check the network and the "
        "endpoint, then run again" + bounds_hint(limits, exc)
    )
