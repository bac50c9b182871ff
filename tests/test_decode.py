from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from packer.decode.check import check_image
from packer.decode.outputs import decode, encode_bmp
from packer.decode.registry import DECODERS, decoders_for, register, sniff
from packer.errors import InputFileError, PackerError


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


def top_down(bmp: bytes) -> bytes:
    """The same BMP stored top-down: negative height, rows reversed."""
    import struct

    offset, width, height = (
        struct.unpack_from("<I", bmp, 10)[0],
        *struct.unpack_from("<ii", bmp, 18),
    )
    stride = (width * 3 + 3) & ~3
    rows = [bmp[offset + r * stride : offset + (r + 1) * stride] for r in range(height)]
    header = bytearray(bmp[:offset])
    struct.pack_into("<i", header, 22, -height)
    return bytes(header) + b"".join(reversed(rows))


def test_bmp_decoder_reads_bottom_up_and_top_down_in_place() -> None:
    image = RGB.resize((5, 6))
    bottom_up = encode_bmp(encoded(image, "PNG"))
    for data in (bottom_up, top_down(bottom_up)):
        assert sniff(data) == "bmp"
        assert [d.name for d in decoders_for("bmp")][0] == "bmp"
        assert np.array_equal(decode(data, "numpy"), np.asarray(image))
        assert np.array_equal(decode(data, "numpy", "pillow"), np.asarray(image))


def test_registry_by_format_with_pillow_fallback() -> None:
    calls: list[str] = []

    def refuses(data: bytes | memoryview) -> None:
        calls.append("refused")
        return None

    def gray(data: bytes | memoryview) -> np.ndarray:
        calls.append("gray")
        return np.zeros((2, 3, 3), dtype=np.uint8)

    jpeg, png = encoded(RGB, "JPEG"), encoded(RGB, "PNG")
    try:
        register("refuses", {"jpeg"}, refuses)
        assert decode(jpeg, "numpy", "refuses").shape == (9, 7, 3)  # refused: Pillow decoded it
        assert calls == ["refused"]
        register("gray", {"png"}, gray)
        assert decode(png, "numpy").shape == (2, 3, 3)  # the png entry, chosen by format
        assert decode(jpeg, "pil", "gray").size == (7, 9)  # not a png: jpeg's auto chain
        assert calls == ["refused", "gray"]
        assert decode(png, "numpy", "pillow").shape == (9, 7, 3)  # a decoder by name
    finally:
        DECODERS.pop("refuses", None)
        DECODERS.pop("gray", None)
        register("pillow", {"*"}, DECODERS["pillow"].fn)  # clears the per-process chains
    with pytest.raises(PackerError, match="unknown decoder 'nvjpeg'"):
        decode(jpeg, "numpy", "nvjpeg")
    assert sniff(b"not an image") == "other"


def test_every_decode_entry_point_raises_only_input_file_errors_on_bad_bytes() -> None:
    """Broken bytes (the odd-input corpus's, and 120 seeded byte flips in a JPEG's scan data)
    through every decode at write and read time: decoded, or an InputFileError that is also a
    ValueError (so a dataset names the sample), never another exception type."""
    from harness.damage import odd_images

    from packer.decode.check import ImageError
    from packer.decode.pixels import to_pixels
    from packer.decode.resize import Resize
    from packer.decode.transforms import RandomResizedCrop

    good = encoded(RGB.resize((48, 32)), "JPEG")
    rng = np.random.default_rng(1)
    broken = [c.data for c in odd_images() if not c.kept and "Mpx" not in c.reason]
    for _ in range(120):
        flipped = bytearray(good)
        flipped[int(rng.integers(len(good) // 2, len(good) - 2))] = int(rng.integers(256))
        broken.append(bytes(flipped))
    entries = {
        "decode auto": lambda d: decode(d, "numpy"),
        "decode pillow": lambda d: decode(d, "numpy", "pillow"),
        "encode_bmp": encode_bmp,
        "to_pixels": lambda d: to_pixels(d, 4),
        "Resize.apply": Resize(max_side=4).apply,
        "RandomResizedCrop": RandomResizedCrop(4, seed=0),
    }
    raised = 0
    for data in broken:
        for name, entry in entries.items():
            try:
                entry(data)
            except InputFileError as exc:
                assert isinstance(exc, ImageError) and isinstance(exc, ValueError), name
                raised += 1
    assert raised > len(broken)  # most of them are refused
