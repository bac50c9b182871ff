"""Decoded storage that pays for small images: fixed-size RGB arrays, no decode at read time.

``packer convert SRC DST.npy --size 112`` decodes every image once, shrinks its shorter side
to 112 (Lanczos; a smaller image is enlarged, since every array has one shape), crops the
centre 112×112 and stores the raw ``H×W×3`` uint8 pixels as the record. The NPY shards then hold
back-to-back arrays of one size: a reader maps them and hands out pixels with no decode at all
(the layout of the downsampled ImageNet 32/64 and CIFAR sets). The manifest records the shape as
``options["pixels"] = [H, W, 3]``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from packer.decode.check import image_errors
from packer.decode.registry import pillow_rgb

__all__ = ["pixels_output", "to_pixels"]


def to_pixels(data: bytes, size: int) -> bytes:
    """Encoded image ``data`` -> ``size×size×3`` RGB bytes (short side to ``size``, centre crop).

    Raises:
        packer.decode.check.ImageError: the data cannot be decoded (whatever Pillow raised).
    """
    with image_errors(""):
        image = pillow_rgb(data)
        scale = size / min(image.width, image.height)
        width = max(size, round(image.width * scale))
        height = max(size, round(image.height * scale))
        if (width, height) != image.size:
            image = image.resize((width, height), Image.Resampling.LANCZOS)
        left, top = (width - size) // 2, (height - size) // 2
        return image.crop((left, top, left + size, top + size)).tobytes()


def pixels_output(data: bytes | memoryview, shape: tuple[int, ...], output: str) -> Any:
    """Stored pixels as ``"numpy"`` (H×W×3 view of ``data``), ``"tensor"`` (3×H×W), ``"pil"``
    or ``"bytes"`` (the raw pixel bytes).

    Raises:
        ValueError: ``data`` does not hold exactly one array of ``shape``.
    """
    if output == "bytes":
        return bytes(data)
    expected = int(np.prod(shape))
    if len(data) != expected:
        raise ValueError(
            f"{len(data)} bytes where a {'×'.join(map(str, shape))} array has {expected}"
        )
    array = np.frombuffer(data, dtype=np.uint8).reshape(shape)
    if output == "numpy":
        return array
    if output == "pil":
        return Image.fromarray(array, "RGB")
    import torch

    return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))  # C×H×W, one copy
