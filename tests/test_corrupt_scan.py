"""No corrupt sample reaches training: the default check walks the compressed stream, and
readers can replace an undecodable sample instead of killing the epoch."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from harness.damage import corrupt_scan
from torch.utils.data import DataLoader

import packer
from packer.demo.image import DemoTree
from packer.errors import InputFileError


@pytest.fixture
def src(tree: DemoTree, tmp_path: Path) -> Path:
    root = Path(
        shutil.copytree(tree.root, tmp_path / "src", ignore=shutil.ignore_patterns("broken*"))
    )
    corrupt_scan(root / "class_01" / "img_00002.JPEG")
    return root


def test_the_default_check_skips_a_corrupt_scan(src: Path, tmp_path: Path) -> None:
    result = packer.convert(src, tmp_path / "out.lmdb", progress=False)
    reasons = {Path(s.path).name: s.reason for s in result.skipped}
    assert "broken image" in reasons["img_00002.JPEG"]
    assert result.manifest.options["check"] == "scan"
    dataset = packer.open_dataset(tmp_path / "out.lmdb")
    assert all(dataset[i][0].size == (64, 48) for i in range(len(dataset)))


def test_on_error_skip_replaces_a_bad_sample_deterministically(src: Path, tmp_path: Path) -> None:
    dst = tmp_path / "fast.npy"
    packer.convert(src, dst, check="fast", progress=False)  # the corrupt JPEG gets in
    strict = packer.open_dataset(dst, output="numpy")
    bad = list(strict.keys).index("class_01/img_00002")
    with pytest.raises(InputFileError, match="class_01/img_00002"):
        strict[bad]
    lenient = packer.open_dataset(dst, output="numpy", on_error="skip")
    image, label = lenient[bad]
    again = packer.open_dataset(dst, output="numpy", on_error="skip")[bad]
    assert (image == again[0]).all() and label == again[1]  # the same stand-in every time
    assert lenient.replaced == 1
    loader = DataLoader(lenient, batch_size=4, num_workers=2, collate_fn=list)
    assert sum(len(batch) for batch in loader) == len(lenient)  # the epoch completes
    with pytest.raises(packer.PackerError, match="unknown on_error"):
        packer.open_dataset(dst, on_error="ignore")


def test_on_error_skip_covers_a_transform_that_decodes(src: Path, tmp_path: Path) -> None:
    from packer.decode.transforms import RandomResizedCrop

    dst = tmp_path / "fast.lmdb"
    packer.convert(src, dst, check="fast", progress=False)  # the corrupt JPEG gets in
    crop = RandomResizedCrop(32, decoder="pillow")
    strict = packer.open_dataset(dst, output="bytes", transform=crop)
    bad = list(strict.keys).index("class_01/img_00002")
    with pytest.raises(InputFileError, match="class_01/img_00002.*cannot be decoded"):
        strict[bad]
    lenient = packer.open_dataset(dst, output="bytes", transform=crop, on_error="skip")
    image, label = lenient[bad]
    assert tuple(image.shape) == (3, 32, 32) and lenient.replaced == 1
    assert label == lenient.targets[bad + 1]  # the next sample stands in
