"""Decoded NPY (--size): fixed-size RGB arrays, read with no decode, in a DataLoader too."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torch.utils.data import DataLoader

import packer
from packer.cli.app import main
from packer.decode.pixels import to_pixels
from packer.demo.image import DemoTree
from packer.errors import PackerError


def test_to_pixels_crops_the_centre_of_the_short_side_resize() -> None:
    image = Image.new("RGB", (300, 200), (0, 0, 255))
    image.paste((255, 0, 0), (0, 0, 20, 200))  # a red band at the left, outside the crop
    from io import BytesIO

    out = BytesIO()
    image.save(out, format="PNG")
    pixels = np.frombuffer(to_pixels(out.getvalue(), 100), dtype=np.uint8).reshape(100, 100, 3)
    assert (pixels[..., 2] > 250).all() and (pixels[..., 0] < 5).all()
    small = BytesIO()
    Image.new("RGB", (20, 10), (9, 9, 9)).save(small, format="PNG")
    assert len(to_pixels(small.getvalue(), 32)) == 32 * 32 * 3  # enlarged: one shape for all


def test_decoded_npy_reads_pixels_without_decoding(tree: DemoTree, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["convert", str(tree.root), str(tmp_path / "px.npy"), "--size", "24", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["samples"] == len(tree.good)  # the truncated one skipped
    ds = packer.open_dataset(tmp_path / "px.npy", output="numpy")
    assert ds.pixels == (24, 24, 3)
    plain = packer.convert(tree.root, tmp_path / "plain.lmdb", progress=False).dst
    reference = packer.open_dataset(plain, output="bytes")
    for i in range(len(ds)):
        array, label = ds[i]
        assert array.shape == (24, 24, 3) and label == reference.targets[i]
        expected = np.frombuffer(to_pixels(reference[i][0], 24), dtype=np.uint8).reshape(24, 24, 3)
        assert np.array_equal(array, expected)
    tensors = packer.open_dataset(tmp_path / "px.npy", output="tensor")
    image, _ = tensors[0]
    assert image.shape == (3, 24, 24) and image.is_contiguous()
    assert torch.equal(image.permute(1, 2, 0), torch.from_numpy(ds[0][0].copy()))
    loader = DataLoader(tensors, batch_size=5, num_workers=2, multiprocessing_context="forkserver")
    batches = list(loader)
    assert torch.cat([b[0] for b in batches]).shape == (len(ds), 3, 24, 24)
    assert torch.cat([b[1] for b in batches]).tolist() == ds.targets.tolist()
    out = CliRunner().invoke(main, ["inspect", str(tmp_path / "px.npy")]).output
    assert "pixels: 24×24×3 uint8 per sample" in out
    assert packer.verify(tmp_path / "px.npy", full=True, progress=False).ok


def test_size_is_refused_where_it_cannot_hold(tree: DemoTree, tmp_path: Path) -> None:
    with pytest.raises(PackerError, match="needs a .npy destination"):
        packer.convert(tree.root, tmp_path / "x.lmdb", size=24, progress=False)
    with pytest.raises(PackerError, match="needs a .npy destination"):
        packer.convert(tree.root, tmp_path / "x.npy", size=24, short_side=30, progress=False)


def test_a_damaged_pixel_record_is_reported(tree: DemoTree, tmp_path: Path) -> None:
    dst = packer.convert(tree.root, tmp_path / "px.npy", size=16, progress=False).dst
    shard = next(dst.glob("shard-*.npy"))
    data = bytearray(shard.read_bytes())
    data[200] ^= 0xFF
    shard.write_bytes(bytes(data))
    report = packer.verify(dst, progress=False)
    assert not report.ok and any("checksum" in p.what for p in report.problems)
