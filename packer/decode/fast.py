"""Optional fast JPEG decoders (the ``fast`` extra): simplejpeg, OpenCV and PyTurboJPEG.

Each decoder is ``fn(data, denom=1) -> H×W×3 RGB uint8 array or None``. ``denom`` (1, 2, 4 or
8) asks libjpeg for a DCT-scaled decode: ``ceil(W/denom) × ceil(H/denom)`` pixels, much cheaper
than decoding in full and shrinking. A decoder answers None ("not mine": Pillow decodes it) for
anything but an 8-bit baseline or progressive JPEG with 1 (grayscale) or 3 (YCbCr) components —
so CMYK, 12-bit, lossless and arithmetic-coded JPEGs go to Pillow. When the library itself
rejects the data it raises :class:`DecodeFailed`: the registry then asks Pillow, skipping any
other fast decoder, so an odd but valid file still decodes and a broken one fails with Pillow's
error. (OpenCV reports no libjpeg warning: it would return a partly grey image for corrupt
entropy-coded data, so it only refuses truncated files; packer's default ``scan`` check keeps
corrupt scans out of a conversion.)

Policies shared with Pillow (``packer.decode.registry.pillow_rgb``): grayscale comes out as 3-channel
RGB; EXIF orientation is ignored (as torchvision's ``ImageFolder`` does; OpenCV is told
``IMREAD_IGNORE_ORIENTATION``); an image over ``max_pixels`` is refused from its header, before
any pixel is decompressed.

:func:`available` imports the libraries once per process and returns the decoders that load,
fastest first (measured on packer's photo-like demo JPEGs, see ``SPEED_ORDER``); :data:`MISSING`
says why each of the others did not load. This module imports nothing of packer's registry:
:mod:`packer.decode.registry` registers what it returns.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = [
    "DENOMS",
    "DecodeFailed",
    "FAST_DECODERS",
    "MISSING",
    "SPEED_ORDER",
    "JpegInfo",
    "available",
    "check_pixels",
    "jpeg_info",
]

DENOMS = (1, 2, 4, 8)  # the DCT scales every libjpeg decoder and Pillow's draft share
# Fastest first: images/s on 400×350 / 800×700 photo-like JPEGs, one process, this machine:
# simplejpeg 1120 / 300, opencv 1010 / 270, pillow 890 / 230 (turbojpeg: not loadable here).
SPEED_ORDER = ("simplejpeg", "turbojpeg", "opencv")
FAST_DECODERS = frozenset(SPEED_ORDER)
TURBOJPEG_LIB_ENV = "PACKER_TURBOJPEG_LIB"  # path of libturbojpeg.so (3.0+) for PyTurboJPEG

Buffer = bytes | memoryview
FastDecoder = Callable[..., np.ndarray | None]


class DecodeFailed(ValueError):
    """A fast library rejected data it was given: Pillow is to judge it, no other decoder."""


def pixels_text(count: int) -> str:
    """A pixel count for a message: ``90 Mpx``, ``3.5 Mpx`` or, under a million, ``3,072 px``."""
    if count < 1_000_000:
        return f"{count:,} px"
    return f"{count / 1e6:.1f}".removesuffix(".0") + " Mpx"


def check_pixels(width: int, height: int, limit: int) -> None:
    """Raise ValueError if a ``width × height`` image is over ``limit`` pixels."""
    if width * height > limit:
        raise ValueError(
            f"{width}×{height} is over the {pixels_text(limit)} limit "
            "(packer.decode.registry.MAX_PIXELS); refusing to decompress it"
        )


class JpegInfo(NamedTuple):
    """What a JPEG's frame header (SOFn) says."""

    width: int
    height: int
    components: int
    precision: int
    sof: int  # the marker: 0xC0 baseline, 0xC1 extended, 0xC2 progressive, ...

    @property
    def plain(self) -> bool:
        """8-bit Huffman baseline/extended/progressive, grayscale or YCbCr: every decoder's."""
        return (
            self.sof in (0xC0, 0xC1, 0xC2)
            and self.precision == 8
            and self.components in (1, 3)
            and self.width > 0
            and self.height > 0
        )


_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # DHT, JPG and DAC are not frames
_STANDALONE = frozenset(range(0xD0, 0xD8)) | {0x01}  # RSTn and TEM carry no length


def jpeg_info(data: Buffer) -> JpegInfo | None:
    """Size and kind of a JPEG from its markers (no decode), or None if it is not one."""
    view = memoryview(data)
    if bytes(view[:3]) != b"\xff\xd8\xff":
        return None
    pos, end = 2, len(view)
    while pos + 4 <= end:
        if view[pos] != 0xFF:
            return None
        marker = view[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in _STANDALONE:
            pos += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image, or start of scan before any frame
            return None
        (length,) = struct.unpack_from(">H", view, pos + 2)
        if marker in _SOF:
            if pos + 10 > end:
                return None
            precision, height, width, components = struct.unpack_from(">BHHB", view, pos + 4)
            return JpegInfo(width, height, components, precision, marker)
        pos += 2 + length
    return None


def _plain_size(data: Buffer, max_pixels: int) -> JpegInfo | None:
    info = jpeg_info(data)
    if info is None or not info.plain:
        return None
    check_pixels(info.width, info.height, max_pixels)
    return info


def _load_simplejpeg() -> FastDecoder:
    import simplejpeg

    def simplejpeg_rgb(data: Buffer, max_pixels: int, denom: int = 1) -> np.ndarray | None:
        info = _plain_size(data, max_pixels)
        if info is None:
            return None
        wanted = {}
        if denom > 1:  # the smallest libjpeg scale at least this size is exactly 1/denom
            wanted = {"min_width": -(-info.width // denom), "min_height": -(-info.height // denom)}
        try:
            pixels: np.ndarray = simplejpeg.decode_jpeg(data, "rgb", **wanted)
        except ValueError as exc:  # simplejpeg is strict: a libjpeg warning is an error
            raise DecodeFailed(f"simplejpeg: {exc}") from exc
        return pixels

    return simplejpeg_rgb


def _load_opencv() -> FastDecoder:
    import cv2

    cv2.setNumThreads(1)  # decoding is one image per call; workers are the parallelism
    reduced = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2}
    reduced.update({4: cv2.IMREAD_REDUCED_COLOR_4, 8: cv2.IMREAD_REDUCED_COLOR_8})
    rgb_flag = getattr(cv2, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10: no BGR -> RGB pass
    keep = cv2.IMREAD_IGNORE_ORIENTATION  # EXIF orientation ignored, as Pillow here

    def opencv_rgb(data: Buffer, max_pixels: int, denom: int = 1) -> np.ndarray | None:
        info = _plain_size(data, max_pixels)
        if info is None or b"\xff\xd9" not in bytes(data[-4096:]):
            return None  # OpenCV would pad a truncated JPEG with grey: Pillow raises instead
        buffer = np.frombuffer(data, dtype=np.uint8)
        if denom == 1 and rgb_flag is not None:
            pixels = cv2.imdecode(buffer, rgb_flag | keep)
            return pixels if pixels is not None and pixels.ndim == 3 else None
        pixels = cv2.imdecode(buffer, reduced[denom] | keep)
        if pixels is None or pixels.ndim != 3:
            return None
        return cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)

    return opencv_rgb


def _load_turbojpeg() -> FastDecoder:
    import turbojpeg

    try:
        codec = turbojpeg.TurboJPEG(os.environ.get(TURBOJPEG_LIB_ENV) or None)
    except (OSError, RuntimeError) as exc:
        raise RuntimeError(
            f"cannot load libturbojpeg ({str(exc).splitlines()[0]}); install libjpeg-turbo's "
            "TurboJPEG library (3.0 or newer for PyTurboJPEG 2) and, if it is not found, set "
            f"{TURBOJPEG_LIB_ENV}=/path/to/libturbojpeg.so"
        ) from exc

    def turbojpeg_rgb(data: Buffer, max_pixels: int, denom: int = 1) -> np.ndarray | None:
        if _plain_size(data, max_pixels) is None:
            return None
        scaling = (1, denom) if denom > 1 else None
        try:
            pixels: np.ndarray = codec.decode(
                bytes(data), pixel_format=turbojpeg.TJPF_RGB, scaling_factor=scaling
            )
        except (OSError, ValueError, RuntimeError) as exc:
            raise DecodeFailed(f"turbojpeg: {exc}") from exc
        return pixels if pixels.ndim == 3 and pixels.shape[2] == 3 else None

    return turbojpeg_rgb


_LOADERS: dict[str, tuple[Callable[[], FastDecoder], str]] = {
    "simplejpeg": (_load_simplejpeg, "simplejpeg"),
    "turbojpeg": (_load_turbojpeg, "PyTurboJPEG"),
    "opencv": (_load_opencv, "opencv-python-headless"),
}
MISSING: dict[str, str] = {}  # decoder name -> why it is not available in this process
_LOADED: dict[str, FastDecoder] = {}
_TRIED = False
_LOCK = threading.Lock()


def available() -> dict[str, FastDecoder]:
    """The fast decoders whose library loads in this process, fastest first (tried once)."""
    global _TRIED
    with _LOCK:  # decoding threads may ask at once: none sees a half-filled answer
        if _TRIED:
            return dict(_LOADED)
        for name in SPEED_ORDER:
            load, package = _LOADERS[name]
            try:
                _LOADED[name] = load()
            except Exception as exc:  # noqa: BLE001 - an optional library never breaks packer
                missing = isinstance(exc, ImportError) and exc.name is not None
                MISSING[name] = (
                    f"{package} is not installed: pip install 'packer[fast]' (or {package})"
                    if missing
                    else f"{package} is installed but does not load: {exc}"
                )
        _TRIED = True
        return dict(_LOADED)
