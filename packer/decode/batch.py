"""Batch-level transforms on decoded uint8 tensors, run where the model runs.

A training loop that ships uint8 batches (``B×C×H×W``, what the fused crops and
``output="tensor"`` give) moves 4× fewer bytes from the workers to the training process and
over PCIe than float batches, and spends no worker CPU on float conversion. These transforms
then finish the batch on its own device (CPU or GPU), in one pass each::

    flip, normalize = RandomHorizontalFlip(), Normalize(dtype=torch.float16)
    for images, labels in loader:                  # uint8, B×3×224×224
        images = images.to(device, non_blocking=True)
        images = normalize(flip(images))           # fp16, (x / 255 - mean) / std

``Normalize`` follows torchvision's ``ToTensor`` + ``Normalize`` (``x / 255``, then
``(x - mean) / std`` per channel); ``RandomHorizontalFlip`` flips each image of the batch with
probability ``p``, drawn independently per image. Both act on images only: boxes or masks
that travel beside them are not flipped (flip those in the dataset's transform instead).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from packer.errors import PackerError

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "Normalize", "RandomHorizontalFlip"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _images(batch: Any, name: str, channels: int | None = None) -> torch.Tensor:
    """``batch`` checked: a uint8 tensor of ``[B×]C×H×W`` (``channels`` if given)."""
    if not isinstance(batch, torch.Tensor):
        raise PackerError(f"{name} takes a tensor of uint8 images, got {type(batch).__name__}")
    if batch.dtype != torch.uint8:
        raise PackerError(
            f"{name} takes uint8 images (0-255), got {batch.dtype}: apply it to the batch"
            " the loader gives (output='tensor' or a fused crop), before any float conversion"
        )
    if batch.dim() not in (3, 4):
        raise PackerError(
            f"{name} takes C×H×W or B×C×H×W images, got a tensor of shape {tuple(batch.shape)}"
        )
    if channels is not None and batch.shape[-3] != channels:
        raise PackerError(
            f"{name} has {channels} channel(s) of mean/std, the images have {batch.shape[-3]}"
            f" (shape {tuple(batch.shape)}; channels come before height and width)"
        )
    return batch


class Normalize:
    """``(x / 255 - mean) / std`` per channel, from uint8 to ``dtype``, on the batch's device.

    Args:
        mean, std: one value per channel, on the 0-1 scale (default: ImageNet's).
        dtype: the output's float type (``torch.float32``, ``float16``, ``bfloat16``).

    One multiply-add per pixel: ``x * (1 / (255 std)) - mean / std``, computed in ``dtype``
    (fp16 output differs from an fp32 computation by at most ~0.01: fp16's own rounding).
    """

    def __init__(
        self,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.mean = tuple(float(v) for v in mean)
        self.std = tuple(float(v) for v in std)
        if not self.mean or len(self.mean) != len(self.std):
            raise PackerError(
                f"mean and std need one value per channel each, got {len(self.mean)} and"
                f" {len(self.std)}"
            )
        if any(not v > 0 for v in self.std):
            raise PackerError(f"std must be positive, got {self.std}")
        if dtype not in _FLOATS:
            raise PackerError(f"dtype must be a float type, one of {_FLOATS}, got {dtype}")
        self.dtype = dtype
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def _scale_shift(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = device
        if key not in self._constants:
            std = torch.tensor(self.std, dtype=torch.float64)
            mean = torch.tensor(self.mean, dtype=torch.float64)
            shape = (-1, 1, 1)
            scale = (1 / (255 * std)).reshape(shape).to(device=device, dtype=self.dtype)
            shift = (mean / std).reshape(shape).to(device=device, dtype=self.dtype)
            self._constants[key] = (scale, shift)
        return self._constants[key]

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        images = _images(batch, "Normalize", len(self.mean))
        scale, shift = self._scale_shift(images.device)
        out = images.to(self.dtype)
        return out.mul_(scale).sub_(shift)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_constants": {}}  # device tensors are made where it runs

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std}, dtype={self.dtype})"


class RandomHorizontalFlip:
    """Flip each image of a uint8 batch left-right with probability ``p``, on its device.

    Args:
        p: the probability that an image is flipped.
        inplace: flip inside the given tensor (saves a copy of the batch) instead of a new one.
        seed: the transform's own generator, seeded once per process; None: torch's global
            generator (``torch.manual_seed`` reproduces a run).
    """

    def __init__(self, p: float = 0.5, inplace: bool = False, seed: int | None = None) -> None:
        if not 0.0 <= float(p) <= 1.0:
            raise PackerError(f"p must be a probability in [0, 1], got {p!r}")
        self.p = float(p)
        self.inplace = inplace
        self.seed = seed
        self._generator: tuple[int, torch.Generator] | None = None

    def _draws(self, count: int) -> torch.Tensor:
        generator = None
        if self.seed is not None:
            if self._generator is None or self._generator[0] != os.getpid():
                self._generator = (os.getpid(), torch.Generator().manual_seed(self.seed))
            generator = self._generator[1]
        return torch.rand(count, generator=generator) < self.p

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        images = _images(batch, "RandomHorizontalFlip")
        single = images.dim() == 3
        stack = images.unsqueeze(0) if single else images
        flips = self._draws(stack.shape[0]).nonzero().flatten().to(stack.device)
        out = stack if self.inplace else stack.clone()
        if flips.numel():
            out[flips] = stack[flips].flip(-1)
        return out[0] if single else out

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_generator": None}  # each process seeds its own

    def __repr__(self) -> str:
        return f"RandomHorizontalFlip(p={self.p}, inplace={self.inplace}, seed={self.seed})"
