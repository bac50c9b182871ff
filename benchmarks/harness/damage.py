"""Damaged and odd inputs for the tests and benchmarks: a JPEG whose scan is corrupt, the corpus of
odd-but-valid and broken images every format must keep or skip (never abort on), and a small PNG
decompression bomb. Not part of the installed package (``benchmarks/harness``)."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from packer.demo.image import photo_like

__all__ = [
    "OddImage",
    "corrupt_scan",
    "corrupted_scan",
    "odd_images",
    "patched_frame_header",
    "png_bomb",
]


def corrupted_scan(data: bytes) -> bytes:
    """JPEG ``data`` with its entropy-coded data damaged, as a bad disk or download does: a
    marker is written mid-scan, so the header, the end-of-image marker and Pillow's ``verify()``
    still pass while a full decode fails (the case ``--check scan`` exists for)."""
    half = len(data) // 2
    return data[:half] + b"\xff\xd0\xff\xda" + data[half + 4 :]


def corrupt_scan(path: str | os.PathLike[str]) -> None:
    """Damage the JPEG file at ``path`` in place with :func:`corrupted_scan`."""
    Path(path).write_bytes(corrupted_scan(Path(path).read_bytes()))


@dataclass(frozen=True)
class OddImage:
    """One file of :func:`odd_images`: its name, bytes, and what a conversion must do with it."""

    name: str
    data: bytes
    kept: bool  # valid: stored (bytes or pixels intact); else skipped, the reason containing:
    reason: str = ""


def _encoded(image: Image.Image, fmt: str = "JPEG", **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def patched_frame_header(
    data: bytes, marker: int | None = None, precision: int | None = None, size: Any = None
) -> bytes:
    """JPEG ``data`` with its frame header (SOFn) rewritten: another SOF ``marker`` (0xC9:
    arithmetic-coded), sample ``precision`` or declared ``size`` (width, height)."""
    from packer.decode.fast import jpeg_info

    info = jpeg_info(data)
    if info is None:
        raise ValueError("not a JPEG with a frame header")
    pos = data.index(bytes((0xFF, info.sof)))
    out = bytearray(data)
    out[pos + 1] = marker if marker is not None else info.sof
    out[pos + 4] = precision if precision is not None else info.precision
    if size is not None:
        out[pos + 5 : pos + 9] = int(size[1]).to_bytes(2, "big") + int(size[0]).to_bytes(2, "big")
    return bytes(out)


def odd_images(seed: int = 0) -> list[OddImage]:
    """Odd-but-valid and broken images, small, the same bytes for a seed: sides under 8 px,
    progressive, CMYK, grayscale, EXIF + ICC, PNG; and 12-bit, arithmetic-coded (SOF9: a
    patched header; libjpeg decodes whatever follows without complaint), a header declaring
    far more pixels than the data holds, over ``--max-pixels``, a corrupt scan, and JPEG/PNG
    truncations at many lengths."""
    from PIL import ImageCms

    rng = np.random.default_rng(seed)

    def photo(w: int, h: int) -> Image.Image:
        return photo_like(rng, max(w, 64), max(h, 64)).resize((w, h))

    cases = [
        OddImage(f"tiny_{w}x{h}.jpg", _encoded(photo(w, h)), True)
        for w, h in ((1, 1), (1, 40), (40, 1), (7, 7), (7, 40), (40, 7))
    ]
    exif = Image.Exif()
    exif[0x0112], exif[0x010F] = 6, "packer"  # orientation (ignored by every reader), make
    srgb = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    base = _encoded(photo(24, 16))
    progressive = _encoded(photo(24, 16), progressive=True)
    png = _encoded(photo(1, 1), "PNG")
    cases += [
        OddImage("progressive.jpg", progressive, True),
        OddImage("cmyk.jpg", _encoded(photo(24, 16).convert("CMYK")), True),
        OddImage("gray.jpg", _encoded(photo(24, 16).convert("L")), True),
        OddImage("exif_icc.jpg", _encoded(photo(24, 16), exif=exif, icc_profile=srgb), True),
        OddImage("png_1x1.png", png, True),
        OddImage("arithmetic.jpg", patched_frame_header(base, marker=0xC9), True),
        OddImage("twelve_bit.jpg", patched_frame_header(base, precision=12), False, "12-bit"),
        OddImage("forged_size.jpg", patched_frame_header(base, size=(4000, 3000)), False, "forged"),
        OddImage("over_limit.jpg", patched_frame_header(base, size=(30000, 30000)), False, "Mpx"),
        OddImage("corrupt_scan.jpg", corrupted_scan(_encoded(photo(64, 48))), False, "broken"),
    ]
    for stem, data in (("baseline.jpg", base), ("progressive.jpg", progressive), ("1x1.png", png)):
        whole = data.index(b"IEND") - 4 if stem.endswith("png") else len(data)
        for length in sorted({0, 1, 2, 3, 11, len(data) // 3, len(data) // 2, len(data) - 2}):
            # a PNG cut inside its end chunk still holds every pixel: Pillow decodes it, kept
            cases.append(OddImage(f"cut_{length:04d}_of_{stem}", data[:length], length >= whole))
    return cases


def png_bomb(width: int = 20_000, height: int = 10_000) -> bytes:
    """A black 1-bit PNG of ``width × height`` pixels in a few kB: a decompression bomb (the
    default 200 Mpx is over twice Pillow's ``MAX_IMAGE_PIXELS``: refused when opened)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    deflate = zlib.compressobj(9)
    row = bytes(1 + -(-width // 8))  # filter byte 0, then the row's bits: all zero
    idat = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grayscale
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )
