"""Check that input bytes are a usable image before they are packed. Pure functions."""

from __future__ import annotations

import io
import struct
import warnings

from PIL import Image

from packer.errors import InputFileError
from packer.fast_decoders import jpeg_info

__all__ = ["ALLOWED_FORMATS", "CHECKS", "DEFAULT_CHECK", "DEFAULT_MAX_PIXELS", "check_image"]

CHECKS = ("fast", "scan", "decode")
DEFAULT_CHECK = "scan"
# Image formats packer stores and decodes. Pillow tries only these: never EPS/PostScript (which
# would start Ghostscript), never an exotic plugin reached by a crafted file.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF", "PPM")
DEFAULT_MAX_PIXELS = 90_000_000
_JPEG_EOI = b"\xff\xd9"


def check_image(data: bytes, check: str = "fast", max_pixels: int = DEFAULT_MAX_PIXELS) -> None:
    """Raise :class:`InputFileError` with a reason if ``data`` is not a usable image.

    ``"fast"``: the header is identified and verified (of an allowed format, at most
    ``max_pixels`` pixels; a JPEG's markers are walked up to its frame header by packer, any other
    format is opened by Pillow), and a JPEG must end with its end-of-image marker (a truncated
    JPEG does not). ``"scan"`` (the conversion default): also walk the whole compressed stream — a
    JPEG decoded at 1/8 scale (the entropy-coded data is still read in full, at ~60 % of a full
    decode's cost), other formats decoded — so an image whose scan data is corrupt never
    reaches training. ``"decode"``: decode every pixel at full size.
    """
    if not data:
        raise InputFileError("empty file (0 bytes)")
    jpeg = jpeg_info(data)  # a JPEG's header is read from its markers, no Pillow image
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            fmt: str | None = "JPEG"
            if jpeg is not None:
                _check_size(jpeg.width, jpeg.height, max_pixels)
            else:
                with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as image:
                    fmt = image.format
                    _check_size(*image.size, max_pixels)
                    image.verify()
            if fmt == "JPEG" and _JPEG_EOI not in data[-4096:]:
                raise InputFileError("truncated JPEG (no end-of-image marker)")
            if check in ("scan", "decode"):
                with Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS) as image:
                    if check == "scan" and image.format == "JPEG":
                        image.draft(image.mode, (image.width // 8, image.height // 8))
                    image.load()
        except Image.DecompressionBombError as exc:
            raise InputFileError(f"decompression bomb refused by Pillow: {exc}") from exc
        except Image.UnidentifiedImageError as exc:
            raise InputFileError(
                f"not an image Pillow can identify (of {', '.join(ALLOWED_FORMATS)})"
            ) from exc
        except (OSError, ValueError, SyntaxError, struct.error) as exc:
            raise InputFileError(f"broken image: {exc}") from exc


def _check_size(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise InputFileError(
            f"{width}×{height} is {width * height / 1e6:.0f} Mpx, over the "
            f"{max_pixels / 1e6:.0f} Mpx limit (--max-pixels)"
        )
