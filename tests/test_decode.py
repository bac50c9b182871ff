from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from packer.check import check_image
from packer.decode import decode, encode_bmp
from packer.errors import InputFileError


def encoded(image: Image.Image, fmt: str, **kw: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kw)
    return buffer.getvalue()


RGB = Image.fromarray(np.random.default_rng(0).integers(0, 255, (9, 7, 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize(
    "image, fmt",
    [
        (RGB.convert("L"), "JPEG"),
        (RGB.convert("CMYK"), "JPEG"),
        (RGB.convert("P"), "PNG"),
        (RGB.convert("RGBA"), "PNG"),
        (Image.fromarray(np.full((5, 4), 40000, dtype=np.uint16)), "PNG"),
    ],
)
def test_every_mode_decodes_to_rgb(image: Image.Image, fmt: str) -> None:
    data = encoded(image, fmt)
    pil = decode(data, "pil")
    assert pil.mode == "RGB" and pil.size == image.size
    assert decode(data, "numpy").shape == (image.size[1], image.size[0], 3)


def test_sixteen_bit_scaled_not_clipped() -> None:
    data = encoded(Image.fromarray(np.full((5, 4), 40000, dtype=np.uint16)), "PNG")
    assert int(decode(data, "numpy")[0, 0, 0]) == 40000 // 257


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 7])
def test_bmp_fast_path_equals_pillow(width: int) -> None:
    image = RGB.resize((width, 6))
    data = encode_bmp(encoded(image, "PNG"))
    fast = decode(data, "numpy")
    assert np.array_equal(fast, np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
    assert np.array_equal(fast, np.asarray(image))


def test_check_rejects_bad_inputs() -> None:
    good = encoded(RGB, "JPEG")
    check_image(good)
    check_image(good, "decode")
    for data, reason in [
        (b"", "empty file"),
        (b"hello, not an image", "not an image Pillow can identify"),
        (good[: len(good) // 2], "(?i)truncated"),
    ]:
        with pytest.raises(InputFileError, match=reason):
            check_image(data)
