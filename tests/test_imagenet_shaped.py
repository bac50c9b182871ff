"""The issue's whole scenario on an ImageNet-shaped root, through the CLI, for every format:
train with class folders (a nested sub-folder, a corrupt-scan JPEG, an empty class), val as class
folders missing a class, and ImageNet's flat val with its labels CSV."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from harness.damage import corrupt_scan

import packer
from packer.cli.app import main
from packer.demo.image import DemoTree
from packer.source.images import IMAGE_EXTENSIONS


def images_under(root: Path) -> int:
    """An independent count: image files under ``root``, walked with os.walk."""
    return sum(
        1
        for _, _, files in os.walk(root, followlinks=True)
        for f in files
        if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS
    )


@pytest.fixture
def imagenet(tree: DemoTree, tmp_path: Path) -> Path:
    root = tmp_path / "imagenet"
    train = Path(shutil.copytree(tree.root, root / "train"))  # holds one truncated JPEG
    os.makedirs(train / "class_00" / "nested")
    os.rename(train / "class_00" / "img_00001.JPEG", train / "class_00" / "nested" / "img_1.JPEG")
    corrupt_scan(train / "class_02" / "img_00002.JPEG")
    (train / "class_03_empty").mkdir()
    val = Path(shutil.copytree(tree.root, root / "val", ignore=shutil.ignore_patterns("broken*")))
    shutil.rmtree(val / "class_01")
    flat = tmp_path / "flat_val"
    flat.mkdir()
    rows = ["ImageId,PredictionString"]
    for n, path in enumerate(sorted((root / "val").rglob("*.JPEG"))):
        shutil.copy(path, flat / f"ILSVRC2012_val_{n + 1:08d}.JPEG")
        rows.append(f"ILSVRC2012_val_{n + 1:08d},{path.parent.name} 1 2 3 4")
    (tmp_path / "LOC_val_solution.csv").write_text("\n".join(rows) + "\n")
    return root


@pytest.mark.parametrize("suffix", [".lmdb", ".h5", ".npy", ".bmp"])
def test_imagenet_as_it_ships(imagenet: Path, tmp_path: Path, suffix: str) -> None:
    run = CliRunner().invoke
    dst = tmp_path / f"imagenet{suffix}"
    refused = run(main, ["convert", str(imagenet), str(dst), "-q"])
    assert refused.exit_code != 0 and "class_03_empty" in refused.output
    assert "--allow-empty" in refused.output and not dst.exists()
    assert not (tmp_path / f"imagenet{suffix}.partial").exists()  # nothing left to --resume
    done = run(main, ["convert", str(imagenet), str(dst), "-q", "--allow-empty"])
    assert done.exit_code == 0, done.output
    assert "image classes: 4 in splits train, val" in done.output
    assert "img_00002.JPEG" in done.output  # the corrupt-scan JPEG is listed as skipped
    train = packer.open_dataset(dst, split="train", output="bytes")
    val = packer.open_dataset(dst, split="val", output="bytes")
    assert train.class_to_idx == val.class_to_idx
    assert train.classes == ["class_00", "class_01", "class_02", "class_03_empty"]
    assert len(train) == images_under(imagenet / "train") - 2  # the truncated and the corrupt
    assert len(val) == images_under(imagenet / "val")
    assert "class_00/nested/img_1" in list(train.keys)
    assert set(val.targets.tolist()) == {0, 2}  # class_02 keeps its index without class_01
    for ds in (train, val):  # every sample decodes: no corrupt sample reaches training
        for i in range(len(ds)):
            packer.open_dataset(dst, split=ds is val and "val" or "train")[i]
    flat_dst = tmp_path / f"flat{suffix}"
    flat = run(
        main,
        [
            "convert",
            str(tmp_path / "flat_val"),
            str(flat_dst),
            "-q",
            "--labels",
            str(tmp_path / "LOC_val_solution.csv"),
            "--classes-from",
            str(dst),
        ],
    )
    assert flat.exit_code == 0, flat.output
    flat_val = packer.open_dataset(flat_dst, output="bytes")
    assert flat_val.class_to_idx == train.class_to_idx
    assert sorted(flat_val.targets.tolist()) == sorted(val.targets.tolist())
    # ImageNet as it ships, in one command: train/ class folders and the flat val/ + its CSV
    shutil.rmtree(imagenet / "val")
    shutil.copytree(tmp_path / "flat_val", imagenet / "val")
    csv = tmp_path / "LOC_val_solution.csv"
    one_dst = tmp_path / f"one{suffix}"
    one = run(
        main, ["convert", str(imagenet), str(one_dst), "-q", "--allow-empty", "--labels", str(csv)]
    )
    assert one.exit_code == 0, one.output
    assert "val: labels file LOC_val_solution.csv, classes from train" in one.output
    truth = dict(row.split(",")[0:2] for row in csv.read_text().splitlines()[1:])
    one_val = packer.open_dataset(one_dst, split="val", output="bytes")
    assert one_val.classes == train.classes
    assert {k: one_val.classes[t] for k, t in zip(one_val.keys, one_val.targets)} == {
        stem: label.split()[0] for stem, label in truth.items()
    }
    assert len(packer.open_dataset(one_dst, split="train")) == len(train)
