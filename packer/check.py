"""Check that input bytes are a usable image before they are packed. Pure functions."""

from __future__ import annotations

import io
import struct
import warnings

from PIL import Image

from packer.errors import InputFileError

__all__ = ["CHECKS", "check_image"]

CHECKS = ("fast", "decode")
_JPEG_EOI = b"\xff\xd9"


def check_image(data: bytes, check: str = "fast") -> None:
    """Raise :class:`InputFileError` with a reason if ``data`` is not a usable image.

    ``"fast"``: Pillow identifies and verifies the header, and a JPEG must end with its
    end-of-image marker (a truncated JPEG does not). ``"decode"``: also decode every pixel.
    """
    if not data:
        raise InputFileError("empty file (0 bytes)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as image:
                fmt = image.format
                image.verify()
            if check == "decode":
                with Image.open(io.BytesIO(data)) as image:
                    image.load()
        except Image.DecompressionBombError as exc:
            raise InputFileError(f"decompression bomb refused by Pillow: {exc}") from exc
        except Image.UnidentifiedImageError as exc:
            raise InputFileError("not an image Pillow can identify") from exc
        except (OSError, ValueError, SyntaxError, struct.error) as exc:
            raise InputFileError(f"broken image: {exc}") from exc
    if fmt == "JPEG" and _JPEG_EOI not in data[-4096:]:
        raise InputFileError("truncated JPEG (no end-of-image marker)")
