"""Encoded bytes to pixels: the decoder registry (Pillow and the fast JPEG libraries), the image
check, decoded outputs, write-time resize and the crops fused with decoding.

``packer.decode.register`` adds a decoder (see :func:`packer.decode.registry.register`).
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "register":
        from packer.decode.registry import register

        return register
    raise AttributeError(f"module 'packer.decode' has no attribute {name!r}")
