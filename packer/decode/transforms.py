"""Decode fused with the crop: training and evaluation transforms that take *encoded bytes*.

Use them as the ``transform=`` of a dataset opened with ``output="bytes"``::

    train = packer.open_dataset("train.lmdb", output="bytes",
                                transform=RandomResizedCrop(224))
    val = packer.open_dataset("val.lmdb", output="bytes", transform=ResizedCenterCrop(224))

Each reads the image size from the JPEG frame header (no decode), picks the crop, then decodes
the JPEG at the smallest DCT scale (1/8, 1/4, 1/2 or 1) at which the crop still has at least
the output's pixels — libjpeg then does a fraction of the work of a full decode — and resizes
the crop to ``size`` (bilinear with antialias: torch's vectorised uint8 kernel on the decoded
array when the box falls on whole pixels, 2.5× faster than Pillow's ``resize`` here; Pillow's
``resize`` over the scaled box otherwise, and for ``output="pil"``). Other
formats, and a JPEG every fast decoder refuses, are decoded in full (Pillow's ``draft`` still
scales a JPEG). The output differs from "decode, crop, resize" only by libjpeg's scaled IDCT
standing in for part of the antialiasing (see ``tests/test_transforms.py`` for the bound).

Crops follow torchvision's ``RandomResizedCrop.get_params`` and ``Resize`` + ``CenterCrop``
(re-implemented from their description). Random numbers come from torch: the global generator
by default, so ``torch.manual_seed`` makes a run reproducible and each DataLoader worker (seeded
by torch per worker and epoch) draws its own crops; ``seed=`` gives the transform its own
generator instead, seeded from ``(seed, worker id)`` once per process — for tests and
single-process reproducibility (a non-persistent worker restarts its stream every epoch).
EXIF orientation is ignored, as everywhere in packer.
"""

from __future__ import annotations

import io
import math
import os
from typing import Any

import numpy as np
import torch
from PIL import Image

from packer.decode import fast as fast_decoders
from packer.decode import registry as decoders
from packer.decode.check import ALLOWED_FORMATS, image_errors
from packer.errors import PackerError

__all__ = [
    "TRANSFORM_OUTPUTS",
    "RandomResizedCrop",
    "ResizedCenterCrop",
    "crop_params",
    "pick_denom",
]

TRANSFORM_OUTPUTS = ("tensor", "numpy", "pil")
Box = tuple[float, float, float, float]  # left, top, right, bottom in full-size pixels


def crop_params(
    width: int,
    height: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    generator: torch.Generator | None = None,
) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random crop, as torchvision's ``RandomResizedCrop``.

    Ten attempts draw an area fraction uniformly in ``scale`` and an aspect ratio (w/h)
    log-uniformly in ``ratio``; the first crop that fits is placed uniformly. Otherwise the
    whole image, cut to the nearest end of the ratio range, centred.
    """
    area = width * height
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target = area * torch.empty(1).uniform_(scale[0], scale[1], generator=generator).item()
        aspect = math.exp(torch.empty(1).uniform_(log_low, log_high, generator=generator).item())
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(torch.randint(0, height - h + 1, (1,), generator=generator).item())
            left = int(torch.randint(0, width - w + 1, (1,), generator=generator).item())
            return top, left, h, w
    if width / height < min(ratio):
        w, h = width, round(width / min(ratio))
    elif width / height > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def pick_denom(crop_w: float, crop_h: float, out_w: int, out_h: int) -> int:
    """The largest DCT denominator (8, 4, 2, 1) at which the crop keeps ``out`` pixels."""
    for denom in (8, 4, 2):
        if crop_w >= out_w * denom and crop_h >= out_h * denom:
            return denom
    return 1


def _pillow_scaled(data: bytes | memoryview, denom: int) -> tuple[Image.Image, int]:
    image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
    width, height = image.size
    fast_decoders.check_pixels(width, height, decoders.MAX_PIXELS)
    if denom > 1:
        image.draft("RGB", (max(1, width // denom), max(1, height // denom)))
        if image.size != (-(-width // denom), -(-height // denom)):
            denom = 1  # draft declined: decoded in full
    return image.convert("RGB") if image.mode != "RGB" else image, denom


def decode_scaled(
    data: bytes | memoryview, denom: int, decoder: str = "auto"
) -> tuple[Image.Image, int]:
    """A JPEG decoded at ``1/denom`` (or in full), as an RGB image, and the scale it got."""
    pixels, denom = _decoded(data, denom, decoder)
    return _as_image(pixels), denom


def _decoded(data: bytes | memoryview, denom: int, decoder: str) -> tuple[decoders.Pixels, int]:
    """:func:`decode_scaled`'s pixels as the decoder gave them: an H×W×3 array or an image."""
    if decoder not in ("auto", "pillow") and decoder not in fast_decoders.FAST_DECODERS:
        return decoders.decode_pixels(data, decoder), 1  # a registered decoder
    fast = fast_decoders.available()
    chain = [] if decoder == "pillow" else [fast[decoder]] if decoder in fast else fast.values()
    for fn in chain:
        try:
            pixels = fn(data, decoders.MAX_PIXELS, denom)
        except fast_decoders.DecodeFailed:
            break  # Pillow judges it (see packer.decode.fast)
        if pixels is not None:
            return pixels, denom
    return _pillow_scaled(data, denom)


def _wrap(pixels: np.ndarray) -> Image.Image:
    """An RGB image over the array's memory (``fromarray`` would copy it)."""
    pixels = np.ascontiguousarray(pixels)
    height, width = pixels.shape[:2]
    return Image.frombuffer("RGB", (width, height), pixels, "raw", "RGB", 0, 1)


def _shape(pixels: decoders.Pixels) -> tuple[int, int]:
    """``(width, height)`` of an image or an H×W×3 array."""
    if isinstance(pixels, Image.Image):
        return pixels.size
    return int(pixels.shape[1]), int(pixels.shape[0])


def _as_image(pixels: decoders.Pixels) -> Image.Image:
    return pixels if isinstance(pixels, Image.Image) else _wrap(pixels)


def _size(size: int | tuple[int, int]) -> tuple[int, int]:
    """``(h, w)`` from an int or a pair, as torchvision."""
    pair = (size, size) if isinstance(size, int) else tuple(size)
    if len(pair) != 2 or not all(isinstance(v, int) and v > 0 for v in pair):
        raise PackerError(f"size must be a positive int or (height, width), got {size!r}")
    return int(pair[0]), int(pair[1])


class _FusedCrop:
    """Header -> crop box -> scaled decode -> resize of the box -> output."""

    # Takes the stored (encoded) bytes: a dataset with fields hands them over undecoded when
    # this is a field's transform, whatever its ``output``.
    takes_encoded = True

    def __init__(self, size: int | tuple[int, int], decoder: str, output: str) -> None:
        self.size = _size(size)
        if output not in TRANSFORM_OUTPUTS:
            raise PackerError(
                f"unknown output {output!r}; expected one of {', '.join(TRANSFORM_OUTPUTS)}"
            )
        self.output = output
        self.decoder = decoders.check_decoder(decoder)

    def box(self, width: int, height: int) -> Box:
        """The region of a ``width × height`` image that becomes the output."""
        raise NotImplementedError

    # Resample the box's pixels only (crop, then resize: torchvision's RandomResizedCrop). False:
    # the box is a window of the resized whole image (Resize, then CenterCrop), Pillow's box.
    crop_first = True

    def __call__(self, data: bytes | memoryview) -> Any:
        out_h, out_w = self.size
        with image_errors(""):  # whatever a decoder raises on bad bytes: ImageError
            info = fast_decoders.jpeg_info(data)
            if info is not None and info.width > 0 and info.height > 0:
                fast_decoders.check_pixels(info.width, info.height, decoders.MAX_PIXELS)
                box = self.box(info.width, info.height)
                denom = pick_denom(box[2] - box[0], box[3] - box[1], out_w, out_h)
                pixels, denom = _decoded(data, denom, self.decoder)
            else:
                pixels, denom = decoders.decode_pixels(data, self.decoder), 1
                box = self.box(*_shape(pixels))
            width, height = _shape(pixels)
            scaled = (box[0] / denom, box[1] / denom, box[2] / denom, box[3] / denom)
            scaled = (*scaled[:2], min(scaled[2], width), min(scaled[3], height))
            mirror = self.mirrored()
            if self.crop_first and self.output != "pil" and all(v.is_integer() for v in scaled):
                return self._torch_resized(pixels, tuple(int(v) for v in scaled), mirror)
            image = _as_image(pixels)
            result = image.resize((out_w, out_h), Image.Resampling.BILINEAR, box=scaled)
        if self.output == "pil":
            return result.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if mirror else result
        array = np.asarray(result)
        array = array[:, ::-1] if mirror else array
        if self.output == "numpy":
            return array.copy()  # writable, unlike np.asarray of a PIL image
        return torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))  # numpy copies

    def mirrored(self) -> bool:
        """Whether this output is flipped left-right (drawn after the crop; never here)."""
        return False

    def _torch_resized(self, pixels: decoders.Pixels, box: tuple[int, ...], mirror: bool) -> Any:
        """The whole-pixel box of an H×W×3 array resized by torch's antialiased bilinear
        kernel for uint8 (channels-last, vectorised; within 1 of Pillow's, as torchvision v2),
        flipped on the copy that lays the output out anyway when ``mirror``."""
        array = np.asarray(pixels.convert("RGB") if isinstance(pixels, Image.Image) else pixels)
        if not array.flags.writeable:  # np.asarray of an image: torch wants writable memory
            array = array.copy()
        left, top, right, bottom = box
        view = torch.from_numpy(array).permute(2, 0, 1)[None, :, top:bottom, left:right]
        resized = torch.nn.functional.interpolate(
            view, size=self.size, mode="bilinear", antialias=True, align_corners=False
        )[0]
        if self.output == "numpy":
            hwc = resized.permute(1, 2, 0)
            return hwc.flip(1).numpy() if mirror else np.ascontiguousarray(hwc.numpy())
        return resized.flip(-1).contiguous() if mirror else resized.contiguous()

    def _fields(self) -> str:
        return f"size={self.size}, decoder={self.decoder!r}, output={self.output!r}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._fields()})"


class RandomResizedCrop(_FusedCrop):
    """torchvision's ``RandomResizedCrop`` on encoded bytes, decoding only what it needs.

    Args:
        size: output ``(height, width)``, or an int for a square.
        scale: range of the crop's area as a fraction of the image's.
        ratio: range of the crop's aspect ratio (width / height), drawn log-uniformly.
        decoder: ``"auto"`` or a decoder name (see :mod:`packer.decode.registry`).
        output: ``"tensor"`` (3×H×W uint8), ``"numpy"`` (H×W×3 uint8) or ``"pil"``.
        seed: the transform's own generator (see the module docstring); None: torch's.
        hflip: probability of flipping the output left-right (torchvision's
            ``RandomHorizontalFlip(hflip)`` after the crop), done by the copy that lays the output
            out anyway; drawn after the crop, from the same generator. 0 (default): never.
    """

    def __init__(
        self,
        size: int | tuple[int, int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        decoder: str = "auto",
        output: str = "tensor",
        seed: int | None = None,
        hflip: float = 0.0,
    ) -> None:
        super().__init__(size, decoder, output)
        if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
            raise PackerError(
                f"scale and ratio must be increasing positive ranges, got {scale} and {ratio}"
            )
        if not 0.0 <= float(hflip) <= 1.0:
            raise PackerError(f"hflip must be a probability in [0, 1], got {hflip!r}")
        self.hflip = float(hflip)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.seed = seed
        self._generator: tuple[int, torch.Generator] | None = None

    def generator(self) -> torch.Generator | None:
        """This process's generator when ``seed`` is set (None: torch's global one)."""
        if self.seed is None:
            return None
        if self._generator is None or self._generator[0] != os.getpid():
            worker = torch.utils.data.get_worker_info()
            entropy = [self.seed, 0 if worker is None else worker.id + 1]
            state = int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1)
            self._generator = (os.getpid(), torch.Generator().manual_seed(state))
        return self._generator[1]

    def box(self, width: int, height: int) -> Box:
        top, left, h, w = crop_params(width, height, self.scale, self.ratio, self.generator())
        return float(left), float(top), float(left + w), float(top + h)

    def mirrored(self) -> bool:
        if self.hflip <= 0.0:
            return False  # no draw: the generator's stream is the crops' alone, as before
        return bool(torch.rand(1, generator=self.generator()).item() < self.hflip)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_generator": None}  # each process seeds its own

    def _fields(self) -> str:
        return f"{super()._fields()}, scale={self.scale}, ratio={self.ratio}, hflip={self.hflip}"


class ResizedCenterCrop(_FusedCrop):
    """torchvision's ``Resize(resize)`` + ``CenterCrop(size)`` (evaluation) on encoded bytes.

    The shorter side is resized to ``resize`` (the longer one to ``int(resize * long /
    short)``), then the centre ``size`` is cut (offsets rounded as torchvision); only that
    region is resampled, from the smallest DCT scale at least as large as the resized image.
    """

    crop_first = False  # Resize(resize) then CenterCrop: the window of a resized image

    def __init__(
        self,
        size: int | tuple[int, int] = 224,
        resize: int = 256,
        decoder: str = "auto",
        output: str = "tensor",
    ) -> None:
        super().__init__(size, decoder, output)
        if not isinstance(resize, int) or resize < max(self.size):
            raise PackerError(f"resize must be an int >= the crop size {self.size}, got {resize!r}")
        self.resize = resize

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """``(w, h)`` after torchvision's ``Resize(resize)``."""
        if width <= height:
            return self.resize, int(self.resize * height / width)
        return int(self.resize * width / height), self.resize

    def box(self, width: int, height: int) -> Box:
        new_w, new_h = self.resized(width, height)
        crop_h, crop_w = self.size
        top, left = int(round((new_h - crop_h) / 2.0)), int(round((new_w - crop_w) / 2.0))
        sx, sy = width / new_w, height / new_h
        return left * sx, top * sy, (left + crop_w) * sx, (top + crop_h) * sy

    def _fields(self) -> str:
        return f"{super()._fields()}, resize={self.resize}"
