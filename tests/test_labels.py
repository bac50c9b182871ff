"""ImageNet's validation set as it ships: one flat folder plus LOC_val_solution.csv."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.demo.image import DemoTree
from packer.errors import SourceError
from packer.source.labels import classes_from, read_classes, read_labels, scan_flat


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


# --- read_labels, read_classes and scan_flat on their own (the cases mutation testing found
# unguarded: `make mutants`) ---


def test_labels_files_read_as_written(tmp_path: Path) -> None:
    lines = tmp_path / "bom.txt"  # a byte-order mark, extra tokens after the label
    lines.write_text("\ufeffimg0 cat 10 20\nimg1.JPEG dog\n", encoding="utf-8")
    assert read_labels(lines) == {"img0": "cat", "img1": "dog"}
    empty = tmp_path / "empty.csv"
    empty.write_text("\n  \n")
    with pytest.raises(SourceError, match=f"labels file {str(empty)!r} is empty"):
        read_labels(empty)
    missing = tmp_path / "missing.csv"
    with pytest.raises(SourceError, match=f"cannot read labels file {str(missing)!r}: "):
        read_labels(missing)
    broken = tmp_path / "broken.txt"
    broken.write_text("img0 cat\nimg1\n")
    with pytest.raises(SourceError, match=f"{str(broken)!r} line 2: expected a name and a label"):
        read_labels(broken)


def test_classes_files(tmp_path: Path, packed: dict[str, Path]) -> None:
    good = tmp_path / "classes.txt"
    good.write_text(" cat \n\ndog\nbird\n")
    assert read_classes(good) == ["cat", "dog", "bird"]
    for text in ("", "cat\ndog\ncat\n"):
        good.write_text(text)
        with pytest.raises(SourceError, match=f"classes file {str(good)!r} is empty or names"):
            read_classes(good)
    with pytest.raises(SourceError, match=f"cannot read classes file {str(tmp_path)!r}: "):
        read_classes(tmp_path)
    assert classes_from(packed[".lmdb"]) == ["class_00", "class_01", "class_02"]


def test_scan_flat_lists_what_it_leaves_out(tree: DemoTree, tmp_path: Path) -> None:
    folder = tmp_path / "flat"
    folder.mkdir()
    for n, path in enumerate(sorted(tree.good)[:3]):
        shutil.copy(path, folder / f"img{n}.jpg")
    (folder / "README.txt").write_text("sorts first, not an image")
    (folder / "sub.jpg").mkdir()  # named like an image, a folder
    shutil.copy(sorted(tree.good)[3], folder / ".hidden.jpg")
    labels = {"img0": "cat", "img1": "1", "ghost": "dog"}
    scan = scan_flat(folder, labels)
    assert scan.root == str(folder.resolve()) and scan.kind == "image"
    assert scan.classes == ["cat", "dog"]
    assert [(s.key, s.label) for s in scan.samples] == [("img0", 0), ("img1", 1)]
    assert scan.ignored == 2  # README.txt and sub.jpg; hidden files are not counted
    assert [(s.path, s.reason) for s in scan.skipped] == [
        (str(folder / "img2.jpg"), "no label in labels"),
        ("labels:ghost", "label without an image"),
    ]


def test_scan_flat_errors_name_what_is_wrong(tree: DemoTree, tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(SourceError, match=f"source {str(missing)!r} is not a folder"):
        scan_flat(missing, {})
    folder = tmp_path / "flat"
    folder.mkdir()
    shutil.copy(sorted(tree.good)[0], folder / "img0.jpg")
    with pytest.raises(SourceError, match=f"no image of {str(folder)!r} has a label in x.csv"):
        scan_flat(folder, {"other": "cat"}, labels_name="x.csv")
    expected = (
        r"x.csv: 1 image\(s\) have a label that is not a class of the index \(2 classes, the given "
        r"index\) nor an index below 2: '2' \(e.g. 'img0.jpg'\); fix the labels file, or pin the "
        r"index with --classes FILE or --classes-from OUTPUT"
    )
    with pytest.raises(SourceError, match=expected):
        scan_flat(folder, {"img0": "2"}, classes=["cat", "dog"], labels_name="x.csv")
    assert scan_flat(folder, {"img0": "1"}, classes=["cat", "dog"]).samples[0].label == 1
