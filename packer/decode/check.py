"""Check that input bytes are a usable image before they are packed. Pure functions."""

from __future__ import annotations

import io
import struct
import warnings
from types import TracebackType

from PIL import Image

from packer.decode.fast import JpegInfo, jpeg_info, pixels_text
from packer.errors import InputFileError, PackerError

__all__ = [
    "ALLOWED_FORMATS",
    "CHECKS",
    "DEFAULT_CHECK",
    "DEFAULT_MAX_PIXELS",
    "ImageError",
    "check_image",
    "describe_error",
    "image_errors",
]

CHECKS = ("fast", "scan", "decode")
DEFAULT_CHECK = "scan"
# Image formats packer stores and decodes. Pillow tries only these: never EPS/PostScript (which
# would start Ghostscript), never an exotic plugin reached by a crafted file.
ALLOWED_FORMATS = ("JPEG", "PNG", "WEBP", "BMP", "GIF", "TIFF", "PPM")
DEFAULT_MAX_PIXELS = 90_000_000
_JPEG_EOI = b"\xff\xd9"
# What a library raises on bad bytes in the ordinary way: its message says it all. Anything else
# (ZeroDivisionError, IndexError, EOFError ... from a decoder's corner case) is named by its type.
_EXPECTED = (OSError, ValueError, SyntaxError, struct.error)


class ImageError(InputFileError, ValueError):
    """One image's bytes cannot be checked, decoded or re-encoded.

    An :class:`InputFileError` (a conversion skips the input, a dataset with
    ``on_error="skip"`` the sample) that is also a ``ValueError``, so code catching a decoder's
    usual ``OSError``/``ValueError`` (and naming the sample) catches it too.
    """


def describe_error(exc: BaseException) -> str:
    """A one-line reason for an exception a library raised on one image's bytes."""
    if isinstance(exc, Image.DecompressionBombError):
        return f"decompression bomb refused by Pillow: {exc}"
    if isinstance(exc, Image.UnidentifiedImageError):
        return f"not an image Pillow can identify (of {', '.join(ALLOWED_FORMATS)})"
    if isinstance(exc, _EXPECTED) or isinstance(exc, PackerError):
        return str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class image_errors:  # noqa: N801 - used as a statement: ``with image_errors("broken image"):``
    """Turn any exception raised on one image's bytes into :class:`ImageError` (``what: why``,
    or the reason alone when ``what`` is empty).

    Packer's own errors (already explained) and ``MemoryError`` (the machine's problem, not the
    file's) pass through, as do ``KeyboardInterrupt`` and ``SystemExit`` (not ``Exception``).
    """

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # never swallows: an exception passes through or becomes an ImageError
        if not isinstance(exc, Exception) or isinstance(exc, (MemoryError, PackerError)):
            return
        reason = describe_error(exc)
        plain = isinstance(exc, (Image.DecompressionBombError, Image.UnidentifiedImageError))
        if self.what and not plain:
            reason = f"{self.what}: {reason}"
        raise ImageError(reason) from exc


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
    with warnings.catch_warnings(), image_errors("broken image"):
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        jpeg = jpeg_info(data)  # a JPEG's header is read from its markers, no Pillow image
        fmt: str | None = "JPEG"
        if jpeg is not None:
            _check_size(jpeg.width, jpeg.height, max_pixels)
            _check_jpeg(jpeg, len(data))
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
                    image.draft(image.mode, _eighth(image.size))
                image.load()


def _eighth(size: tuple[int, int]) -> tuple[int, int]:
    """The size to ask Pillow's ``draft`` for so that it decodes at 1/8 scale, its smallest:
    it picks the largest scale whose result is at least this size, so a side is rounded down
    (rounded up, 350 px asks for 44 > 350/8 and gets 1/4 scale, ~15 % more work)."""
    return max(1, size[0] // 8), max(1, size[1] // 8)


def _check_size(width: int, height: int, max_pixels: int) -> None:
    if width * height > max_pixels:
        raise InputFileError(
            f"{width}×{height} is {pixels_text(width * height)}, over the "
            f"{pixels_text(max_pixels)} limit (--max-pixels)"
        )


# Fewest bits a Huffman-coded JPEG spends per 8×8 block of its full-resolution component: a
# sequential scan codes each block's DC and its end-of-block (1 bit each at the very least), a
# progressive first DC scan at least the DC. (Arithmetic coding has no such floor.)
_MIN_BITS_PER_BLOCK = {0xC0: 2, 0xC1: 2, 0xC2: 1}


def _check_jpeg(jpeg: JpegInfo, size: int) -> None:
    """Refuse what libjpeg would decode without an error into mostly invented pixels: a JPEG
    of another precision than 8 bits (Pillow reads only 8-bit ones), or one whose header
    declares far more blocks than its bytes can hold (a forged or patched header: libjpeg
    fills the missing blocks with grey and reports nothing)."""
    if jpeg.precision != 8:
        raise InputFileError(
            f"{jpeg.precision}-bit JPEG: Pillow, packer's reference decoder, reads only 8-bit "
            "JPEGs; convert it to 8 bits first"
        )
    bits = _MIN_BITS_PER_BLOCK.get(jpeg.sof, 0)
    blocks = -(-jpeg.width // 8) * -(-jpeg.height // 8)
    if size * 8 < blocks * bits:
        raise InputFileError(
            f"its header declares {jpeg.width}×{jpeg.height} but it holds {size} bytes, fewer "
            f"than the {blocks * bits // 8} so many pixels need: truncated, or a forged header"
        )
