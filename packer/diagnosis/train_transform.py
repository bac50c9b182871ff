"""The standard training transform, written with Pillow so benchmarks need no torchvision.

``train_transform(224)`` = RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3)) + random
horizontal flip + conversion to an H×W×3 uint8 array, with torchvision's parameter sampling.
It accepts one PIL image or a list of them (the frames of a clip get the same crop and flip).
The crop draws from torch's generator, the flip from Python's ``random``: the DataLoader seeds
both in every worker.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

from packer.decode.transforms import crop_params

__all__ = [
    "Compose",
    "DecodedRandomResizedCrop",
    "RandomHorizontalFlip",
    "ToArray",
    "train_transform",
]


def _each(images: Any, func: Callable[[Image.Image], Any]) -> Any:
    if isinstance(images, (list, tuple)):
        return [func(image) for image in images]
    return func(images)


def _first(images: Any) -> Image.Image:
    return images[0] if isinstance(images, (list, tuple)) else images


class DecodedRandomResizedCrop:
    """Crop a random area and aspect ratio of decoded image(s), then resize to ``size``×``size``.

    torchvision's ``RandomResizedCrop`` on PIL images (a clip's frames share one crop); the
    fused :class:`packer.decode.transforms.RandomResizedCrop` does the same on encoded bytes. The crop
    is drawn by :func:`packer.decode.transforms.crop_params` on torch's generator, which the DataLoader
    seeds in every worker.

    Args:
        size: output side in pixels.
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height).
    """

    def __init__(
        self,
        size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.size = int(size)
        self.scale = scale
        self.ratio = ratio

    def __call__(self, images: Any) -> Any:
        width, height = _first(images).size
        top, left, h, w = crop_params(width, height, self.scale, self.ratio)
        box = (left, top, left + w, top + h)
        size = (self.size, self.size)
        return _each(
            images,
            lambda im: im.resize(size, Image.Resampling.BILINEAR, box=box, reducing_gap=None),
        )


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p`` (the same draw for every frame of a clip)."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def __call__(self, images: Any) -> Any:
        if random.random() >= self.p:
            return images
        return _each(images, lambda im: im.transpose(Image.Transpose.FLIP_LEFT_RIGHT))


class ToArray:
    """PIL image(s) → H×W×3 uint8 array (a clip: T×H×W×3)."""

    def __call__(self, images: Any) -> np.ndarray:
        if isinstance(images, (list, tuple)):
            return np.stack([np.array(im) for im in images])
        return np.array(images)


class Compose:
    """Apply transforms in order."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, value: Any) -> Any:
        for transform in self.transforms:
            value = transform(value)
        return value

    def __repr__(self) -> str:
        return f"Compose({[type(t).__name__ for t in self.transforms]})"


def train_transform(size: int = 224) -> Compose:
    """RandomResizedCrop(size) + RandomHorizontalFlip() + ToArray(): a standard training pipeline."""
    return Compose([DecodedRandomResizedCrop(size), RandomHorizontalFlip(), ToArray()])
