"""Decoders in a registry keyed by name and by the data's format: encoded bytes -> RGB pixels.

A decoder is a function ``bytes -> pixels or None`` (None: "not mine", the next one is tried)
registered for the formats it handles (sniffed from the first bytes). ``decode_pixels(data,
"auto")`` tries the decoders registered for the data's format in order, then Pillow, which
handles everything Pillow can open. A faster or GPU decoder is one :func:`register` call.

Built in: ``"bmp"`` maps the pixel rows of an uncompressed 24-bit BMP (bottom-up or top-down)
straight from the buffer, no Pillow; ``"pillow"`` decodes anything else to RGB (grayscale,
palette, CMYK and RGBA sources converted as torchvision's ``ImageFolder`` loader does). 16-bit
(and 32-bit) grayscale differs on purpose: packer scales it to 8 bits by 1/257 (65535 -> 255,
the whole range kept), where ``ImageFolder``'s ``convert("RGB")`` clips every value above 255 to
white, which loses real 16-bit data.
The JPEG decoders of :mod:`packer.decode.fast` (``"simplejpeg"``, ``"turbojpeg"``,
``"opencv"``) register themselves, fastest first, the first time a chain is built in a process
— those whose library loads; :func:`check_decoder` explains why one is missing.

A decoder chosen by name serves the formats it handles; data of another format takes the
``"auto"`` chain of its format (``decoder="simplejpeg"`` still maps BMPs with ``"bmp"``).
Every decoder ignores EXIF orientation, as Pillow and torchvision's ``ImageFolder`` do.
"""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image

from packer.decode import fast as fast_decoders
from packer.decode.check import ALLOWED_FORMATS, DEFAULT_MAX_PIXELS, image_errors
from packer.errors import PackerError

__all__ = [
    "DECODERS",
    "Decoder",
    "Pixels",
    "check_decoder",
    "decode_pixels",
    "decoders_for",
    "register",
    "sniff",
]

Pixels = np.ndarray | Image.Image
Buffer = bytes | memoryview
MAX_PIXELS = DEFAULT_MAX_PIXELS  # images larger than this are refused, never decompressed


def _check_pixels(width: int, height: int) -> None:
    fast_decoders.check_pixels(width, height, MAX_PIXELS)


_MAGIC = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"BM", "bmp"),
    (b"GIF8", "gif"),
    (b"II*\x00", "tiff"),
    (b"MM\x00*", "tiff"),
)


def sniff(data: Buffer) -> str:
    """The format of encoded image bytes from their first bytes (``"other"`` if unknown)."""
    head = bytes(data[:12])
    for magic, name in _MAGIC:
        if head.startswith(magic):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "webp"
    if head[:1] == b"P" and head[1:2] in b"1234567":
        return "ppm"
    return "other"


@dataclass(frozen=True)
class Decoder:
    """A named decode function for some formats (``"*"``: any format)."""

    name: str
    formats: frozenset[str]
    fn: Callable[[Buffer], Pixels | None]

    def handles(self, fmt: str) -> bool:
        return "*" in self.formats or fmt in self.formats


DECODERS: dict[str, Decoder] = {}


def register(
    name: str, formats: set[str] | frozenset[str], fn: Callable[[Buffer], Pixels | None]
) -> None:
    """Add (or replace) a decoder; ``"auto"`` tries decoders in registration order."""
    DECODERS[name] = Decoder(name, frozenset(formats), fn)
    _CHAINS.clear()


_CHAINS: dict[tuple[str, str], list[Decoder]] = {}


def _limited(fn: fast_decoders.FastDecoder) -> Callable[[Buffer], Pixels | None]:
    def decode_full(data: Buffer) -> Pixels | None:
        return fn(data, MAX_PIXELS)  # the limit as it is now, not as it was at registration

    return decode_full


_FAST_REGISTERED = False


def _register_fast() -> None:
    """Register the fast JPEG decoders whose library loads (once per process)."""
    global _FAST_REGISTERED
    if not _FAST_REGISTERED:
        for name, fn in fast_decoders.available().items():  # loads under a lock, once
            if name not in DECODERS:
                register(name, {"jpeg"}, _limited(fn))
        _FAST_REGISTERED = True


def check_decoder(name: str) -> str:
    """Validate a ``decoder=`` argument and return it.

    Raises:
        PackerError: the name is unknown (the message lists the valid names), or it names a
            fast decoder whose library is missing in this process (the message says what to
            install).
    """
    _register_fast()
    if name == "auto" or name in DECODERS:
        return name
    if name in fast_decoders.MISSING:
        raise PackerError(f"decoder {name!r} is not available: {fast_decoders.MISSING[name]}")
    valid = sorted(set(DECODERS) | fast_decoders.FAST_DECODERS)
    raise PackerError(f"unknown decoder {name!r}; expected auto or one of {', '.join(valid)}")


def decoders_for(fmt: str, name: str = "auto") -> list[Decoder]:
    """The decoders tried, in order, for data of format ``fmt`` (Pillow always last).

    Built once per process and (format, name), so ``"auto"`` is chosen once.
    """
    key = (fmt, name)
    if key not in _CHAINS:
        check_decoder(name)
        chosen: list[Decoder] = list(DECODERS.values())
        if name != "auto" and DECODERS[name].handles(fmt):
            chosen = [DECODERS[name]]
        chain = [d for d in chosen if d.name != "pillow" and d.handles(fmt)]
        _CHAINS[key] = [*chain, DECODERS["pillow"]]
    return _CHAINS[key]


def decode_pixels(data: Buffer, name: str = "auto") -> Pixels:
    """Decode ``data`` with the first decoder of its format's chain that accepts it.

    Raises:
        packer.decode.check.ImageError: the data is not a decodable image — whatever the library
            raised (a decompression bomb, an error of a decoder's corner case), as an
            :class:`~packer.errors.InputFileError` that is also a ``ValueError``.
    """
    with image_errors(""):
        for decoder in decoders_for(sniff(data), name):
            try:
                pixels = decoder.fn(data)
            except fast_decoders.DecodeFailed:
                break  # a library rejected it: Pillow judges, no lenient decoder in between
            if pixels is not None:
                return pixels
        return pillow_rgb(data)  # after a rejection (a chain always ends with Pillow)


def bmp_pixels(data: Buffer) -> np.ndarray | None:
    """H×W×3 RGB view of an uncompressed 24-bit BMP, or None for any other BMP."""
    if len(data) < 54 or bytes(data[:2]) != b"BM":
        return None
    offset, header_size, width, height, _planes, bits, compression = struct.unpack_from(
        "<I I i i H H I", data, 10
    )
    if header_size < 40 or bits != 24 or compression != 0 or width <= 0 or height == 0:
        return None
    rows = abs(height)
    _check_pixels(width, rows)
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


def pillow_rgb(data: Buffer) -> Image.Image:
    """Decode encoded image bytes to a loaded RGB PIL image.

    Raises:
        packer.decode.check.ImageError: the data is not a decodable image (whatever Pillow raised).
    """
    with warnings.catch_warnings(), image_errors(""):
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        image: Image.Image = Image.open(io.BytesIO(data), formats=ALLOWED_FORMATS)
        _check_pixels(*image.size)
        if image.mode != "RGB":
            if image.mode.startswith("I") or image.mode == "F":  # 16/32-bit grayscale
                wide = np.asarray(image, dtype=np.float64)
                image = Image.fromarray(np.clip(wide / 257.0, 0, 255).astype(np.uint8), "L")
            image = image.convert("RGB")
        else:
            image.load()
    return image


register("bmp", {"bmp"}, bmp_pixels)
register("pillow", {"*"}, pillow_rgb)
