"""Encoded bytes -> ``"pil"`` | ``"numpy"`` | ``"tensor"`` | ``"bytes"``. The only module that decodes.

Every decoded output is RGB (grayscale, palette, CMYK and RGBA sources are converted, as
torchvision's ``ImageFolder`` loader does). Uncompressed 24-bit BMP files skip Pillow: their
pixel rows are mapped straight from the bytes.
"""

from __future__ import annotations

import io
import struct
import warnings
from typing import Any

import numpy as np
from PIL import Image

from packer.errors import PackerError

__all__ = ["OUTPUTS", "check_output", "decode", "decode_rgb", "encode_bmp"]

OUTPUTS = ("pil", "numpy", "tensor", "bytes")


def check_output(output: str) -> str:
    """Validate an ``output=`` argument and return it."""
    if output not in OUTPUTS:
        raise PackerError(f"unknown output {output!r}; expected one of {', '.join(OUTPUTS)}")
    return output


def _bmp_pixels(data: bytes | memoryview) -> np.ndarray | None:
    """H×W×3 RGB view of an uncompressed 24-bit BMP, or None for any other BMP."""
    if len(data) < 54 or bytes(data[:2]) != b"BM":
        return None
    offset, header_size, width, height, _planes, bits, compression = struct.unpack_from(
        "<I I i i H H I", data, 10
    )
    if header_size < 40 or bits != 24 or compression != 0 or width <= 0 or height == 0:
        return None
    rows = abs(height)
    stride = (width * 3 + 3) & ~3
    if offset + stride * rows > len(data):
        return None
    flat = np.frombuffer(data, dtype=np.uint8, count=stride * rows, offset=offset)
    pixels = flat.reshape(rows, stride)[:, : width * 3].reshape(rows, width, 3)
    if height > 0:  # bottom-up rows, the usual case
        pixels = pixels[::-1]
    rgb = np.empty((rows, width, 3), dtype=np.uint8)
    for channel in range(3):  # BGR -> RGB, one plane at a time (a [..., ::-1] copy is 3x slower)
        rgb[:, :, channel] = pixels[:, :, 2 - channel]
    return rgb


def decode_rgb(data: bytes | memoryview) -> Image.Image:
    """Decode encoded image bytes to a loaded RGB PIL image (raises OSError/ValueError if broken)."""
    pixels = _bmp_pixels(data)
    if pixels is not None:
        return Image.fromarray(pixels, "RGB")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        image: Image.Image = Image.open(io.BytesIO(data))
        if image.mode != "RGB":
            if image.mode.startswith("I") or image.mode == "F":  # 16/32-bit grayscale
                wide = np.asarray(image, dtype=np.float64)
                image = Image.fromarray(np.clip(wide / 257.0, 0, 255).astype(np.uint8), "L")
            image = image.convert("RGB")
        else:
            image.load()
    return image


def decode(data: bytes | memoryview, output: str = "pil") -> Any:
    """Decode one encoded image into the requested output.

    Args:
        data: encoded bytes (JPEG, PNG, BMP, ... as stored).
        output: ``"pil"`` (RGB PIL image), ``"numpy"`` (H×W×3 uint8), ``"tensor"``
            (3×H×W uint8 torch tensor) or ``"bytes"`` (no decode).
    """
    if output == "bytes":
        return bytes(data)
    if output == "pil":
        return decode_rgb(data)
    pixels = _bmp_pixels(data)
    if pixels is None:
        pixels = np.array(decode_rgb(data))
    if output == "numpy":
        return pixels
    if output == "tensor":
        import torch  # imported here so that converting never loads torch

        return torch.from_numpy(pixels).permute(2, 0, 1)
    raise PackerError(f"unknown output {output!r}; expected one of {', '.join(OUTPUTS)}")


def encode_bmp(data: bytes | memoryview) -> bytes:
    """Decode any image to RGB and encode it as an uncompressed 24-bit BMP."""
    out = io.BytesIO()
    decode_rgb(data).save(out, format="BMP")
    return out.getvalue()
