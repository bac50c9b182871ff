"""Human-readable byte sizes: parse "512MiB" / "1GB" and format 1234567 as "1.2 MB"."""

from __future__ import annotations

import re

from packer.errors import PackerError

__all__ = ["parse_size", "format_size"]

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
