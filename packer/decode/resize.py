"""Write-time resize, shared by images and video frames: ``--short-side``/``--max-side``/``--quality``.

Decode is the cost of reading JPEGs; storing them smaller is the largest saving there is (FFCV's
``max_resolution``, the ImageNet speed-runs). Rules, the same for an image and a frame:

- the aspect ratio is kept and an image is never enlarged: ``short_side=256`` shrinks a
  500×375 photo to 341×256 and leaves a 200×150 one alone; ``max_side`` caps the longer side;
- an image already within the limit keeps its original bytes (no generation loss), unless
  ``reencode`` asks for every image to be re-encoded at ``quality``;
- a resized image is downsampled with a Lanczos filter (high quality; a JPEG is first decoded
  at the largest DCT scale still twice the target, which costs nothing visible) and encoded as
  a baseline JPEG at ``quality`` (default 90), in RGB; EXIF is dropped (packer, like
  torchvision's ImageFolder, ignores EXIF orientation, so pixels do not change meaning).
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from typing import Any

from PIL import Image

from packer.decode.check import ALLOWED_FORMATS, image_errors
from packer.decode.registry import pillow_rgb
from packer.errors import PackerError

__all__ = ["RESIZE_OPTIONS", "Resize", "resize_to"]

RESIZE_OPTIONS = ("quality", "max_side", "short_side", "reencode")


def resize_to(
    width: int, height: int, max_side: int | None, short_side: int | None
) -> tuple[int, int]:
    """Target size: ``short_side`` caps the shorter side, ``max_side`` the longer one; the aspect
    ratio is kept and nothing is enlarged."""
    if short_side is not None and min(width, height) > short_side:
        scale = short_side / min(width, height)
    elif max_side is not None and max(width, height) > max_side:
        scale = max_side / max(width, height)
    else:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


@dataclass(frozen=True)
class Resize:
    """How stored images (or frames) are sized and encoded; the default changes nothing."""

    quality: int = 90
    max_side: int | None = None
    short_side: int | None = None
    reencode: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.quality <= 100:
            raise PackerError(f"invalid quality {self.quality}; expected 1..100 (JPEG quality)")
        for name in ("max_side", "short_side"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise PackerError(
                    f"invalid {name.replace('_', '-')} {value}; expected a positive number"
                )
        if self.max_side is not None and self.short_side is not None:
            raise PackerError("--max-side and --short-side are exclusive; pass one of them")

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> Resize:
        """From ``quality``/``max_side``/``short_side``/``reencode`` (None: the default)."""
        return cls(**{k: v for k, v in options.items() if k in RESIZE_OPTIONS and v is not None})

    @property
    def active(self) -> bool:
        """Whether any image may be re-encoded."""
        return self.reencode or self.max_side is not None or self.short_side is not None

    def recorded(self) -> dict[str, Any]:
        """The manifest's record of these options."""
        return asdict(self)

    def encode(self, image: Image.Image) -> bytes:
        """Resize ``image`` by the rules above and encode it as JPEG at ``quality``.

        Raises:
            packer.decode.check.ImageError: the image cannot be decoded or encoded.
        """
        with image_errors(""):
            size = resize_to(image.width, image.height, self.max_side, self.short_side)
            if size != image.size:
                if image.format == "JPEG":  # DCT-scaled decode down to twice the target, at most
                    image.draft("RGB", (size[0] * 2, size[1] * 2))
                image = image.convert("RGB").resize(size, Image.Resampling.LANCZOS)
            out = io.BytesIO()
            image.convert("RGB").save(out, format="JPEG", quality=self.quality)
            return out.getvalue()

    def apply(self, data: bytes) -> bytes:
        """The bytes to store for encoded image ``data``: unchanged when within the limit.

        Raises:
            packer.decode.check.ImageError: the data cannot be decoded (whatever Pillow raised).
        """
        if not self.active:
            return data
        with image_errors(""), Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as image:
            within = resize_to(image.width, image.height, self.max_side, self.short_side)
            if within == image.size and not self.reencode:
                return data
            if within == image.size or image.format != "JPEG":
                return self.encode(pillow_rgb(data))  # mode conversions as every reader does
            return self.encode(image)
