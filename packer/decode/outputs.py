"""Encoded bytes -> ``"pil"`` | ``"numpy"`` | ``"tensor"`` | ``"bytes"``, through the decoder registry.

Every decoded output is RGB. Which decoder runs is :mod:`packer.decode.registry`' business (by format,
with Pillow as the fallback); this module turns its pixels into the requested output.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from PIL import Image

from packer.decode.check import image_errors
from packer.decode.registry import decode_pixels, pillow_rgb
from packer.errors import PackerError

__all__ = ["OUTPUTS", "check_output", "decode", "decode_rgb", "encode_bmp"]

decode_rgb = pillow_rgb  # Pillow to RGB, whatever the source mode

OUTPUTS = ("pil", "numpy", "tensor", "bytes")


def check_output(output: str) -> str:
    """Validate an ``output=`` argument and return it."""
    if output not in OUTPUTS:
        raise PackerError(f"unknown output {output!r}; expected one of {', '.join(OUTPUTS)}")
    return output


def decode(data: bytes | memoryview, output: str = "pil", decoder: str = "auto") -> Any:
    """Decode one encoded image into the requested output.

    Args:
        data: encoded bytes (JPEG, PNG, BMP, ... as stored).
        output: ``"pil"`` (RGB PIL image), ``"numpy"`` (H×W×3 uint8), ``"tensor"``
            (3×H×W uint8 torch tensor) or ``"bytes"`` (no decode).
        decoder: a name from :data:`packer.decode.registry.DECODERS`, or ``"auto"``.
    """
    if output == "bytes":
        return bytes(data)
    pixels = decode_pixels(data, decoder)
    if output == "pil":
        return pixels if isinstance(pixels, Image.Image) else Image.fromarray(pixels, "RGB")
    array = pixels if isinstance(pixels, np.ndarray) else np.asarray(pixels)
    if output == "numpy":
        return array
    if output == "tensor":
        import torch  # imported here so that converting never loads torch

        # C×H×W, as torchvision; numpy makes the copy (torch's permute+contiguous runs its
        # intra-op thread pool: 10-100× slower per image on a busy machine, measured)
        return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
    raise PackerError(f"unknown output {output!r}; expected one of {', '.join(OUTPUTS)}")


def encode_bmp(data: bytes | memoryview) -> bytes:
    """Decode any image to RGB and encode it as an uncompressed 24-bit BMP.

    Raises:
        packer.decode.check.ImageError: the data cannot be decoded or encoded (whatever Pillow raised).
    """
    out = io.BytesIO()
    with image_errors(""):
        decode(data, "pil", "pillow").save(out, format="BMP")
    return out.getvalue()
