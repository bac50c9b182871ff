"""ImageNet's validation set as it ships: one flat folder plus LOC_val_solution.csv."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.errors import SourceError
from packer.tools.image_demo import DemoTree


@pytest.fixture
def flat_val(tree: DemoTree, tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """``val/ILSVRC2012_val_0000000N.JPEG`` and a LOC-style CSV; one image lacks a label and one
    label lacks its image. Returns the folder, the CSV and the true class of each stem."""
    folder = tmp_path / "val"
    folder.mkdir()
    truth = {}
    for n, path in enumerate(sorted(tree.good)):
        stem = f"ILSVRC2012_val_{n + 1:08d}"
        shutil.copy(path, folder / f"{stem}.JPEG")
        truth[stem] = path.parent.name
    rows = [f"{stem},{cls} 10 20 30 40 {cls} 1 2 3 4" for stem, cls in truth.items()]
    unlabelled = sorted(truth)[0]
    rows = [r for r in rows if not r.startswith(unlabelled)]
    rows.append("ILSVRC2012_val_99999999,class_00 1 1 2 2")  # a label without an image
    csv = tmp_path / "LOC_val_solution.csv"
    csv.write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
    del truth[unlabelled]
    return folder, csv, truth


def test_flat_val_with_labels_and_the_train_index(
    tree: DemoTree, tmp_path: Path, flat_val: tuple[Path, Path, dict[str, str]]
) -> None:
    folder, csv, truth = flat_val
    train = tmp_path / "train.lmdb"
    packer.convert(tree.root, train, progress=False)
    result = CliRunner().invoke(
        main,
        [
            "convert",
            str(folder),
            str(tmp_path / "val.lmdb"),
            "-q",
            "--labels",
            str(csv),
            "--classes-from",
            str(train),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "no label in LOC_val_solution.csv" in result.output
    assert "label without an image" in result.output
    val = packer.open_dataset(tmp_path / "val.lmdb", output="bytes")
    trained = packer.open_dataset(train)
    assert val.class_to_idx == trained.class_to_idx
    assert sorted(val.keys) == sorted(truth)
    assert all(val.classes[val.targets[i]] == truth[val.keys[i]] for i in range(len(val)))


def test_name_label_lines_with_indices_and_unknown_classes(tmp_path: Path, tree: DemoTree) -> None:
    folder = tmp_path / "flat"
    folder.mkdir()
    for n, path in enumerate(sorted(tree.good)[:4]):
        shutil.copy(path, folder / f"img{n}.jpg")
    labels = tmp_path / "labels.txt"
    labels.write_text("img0.jpg 0\nimg1 2\nimg2.jpg 1\nimg3 1\n")
    classes = tmp_path / "classes.txt"
    classes.write_text("cat\ndog\nbird\n")
    packer.convert(
        folder, tmp_path / "a.npy", labels=labels, classes=["cat", "dog", "bird"], progress=False
    )
    ds = packer.open_dataset(tmp_path / "a.npy")
    assert dict(zip(ds.keys, ds.targets.tolist())) == {"img0": 0, "img1": 2, "img2": 1, "img3": 1}
    labels.write_text("img0 zebra\n")
    with pytest.raises(
        SourceError, match="1 image.s. have a label that is not a class of the index .*'zebra'"
    ):
        packer.convert(folder, tmp_path / "b.npy", labels=labels, classes=["cat"], progress=False)
