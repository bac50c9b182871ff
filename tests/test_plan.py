"""A conversion checks its whole plan before writing a byte, and ImageNet converts in one command.

The root is ImageNet-shaped: ``train/<wnid>/`` class folders and a flat ``val/`` labelled by a
``LOC_val_solution.csv`` (``ImageId,PredictionString`` whose first token is the wnid). Labels read
back from the output are compared with the truth the fixture wrote.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.demo.image import DemoTree
from packer.demo.video import make_video_tree
from packer.errors import SourceError

WNIDS = ["n00000001", "n00000002", "n00000003"]


def write_csv(path: Path, truth: dict[str, str]) -> Path:
    rows = [f"{stem},{wnid} 1 2 30 40 {wnid} 3 4 10 20" for stem, wnid in truth.items()]
    path.write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture
def imagenet(tree: DemoTree, tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """``imagenet/train/<wnid>/`` (3 classes), a flat ``imagenet/val/`` whose images come from
    classes n00000002 and n00000003 only (none of n00000001), and its CSV. Returns the root, the
    CSV and the true wnid of each val image stem."""
    root = tmp_path / "imagenet"
    for wnid, name in zip(WNIDS, tree.classes):
        shutil.copytree(tree.root / name, root / "train" / wnid)
    (root / "val").mkdir()
    truth: dict[str, str] = {}
    for n, path in enumerate(p for p in sorted(tree.good) if p.parent.name != tree.classes[0]):
        stem = f"ILSVRC2012_val_{n + 1:08d}"
        shutil.copy(path, root / "val" / f"{stem}.JPEG")
        truth[stem] = WNIDS[tree.classes.index(path.parent.name)]
    return root, write_csv(tmp_path / "LOC_val_solution.csv", truth), truth


def invoke(*args: object) -> tuple[int, str, str]:
    done = CliRunner().invoke(main, ["convert", *map(str, args)])
    return done.exit_code, done.stdout, done.stderr


def nothing_written(dst: Path) -> bool:
    """No output and no data file in an interrupted-conversion folder."""
    partial = dst.with_name(dst.name + ".partial")
    files = [f for _, _, names in os.walk(partial) for f in names] if partial.exists() else []
    return not dst.exists() and not files


@pytest.mark.parametrize("suffix", [".lmdb", ".npy"])
def test_imagenet_converts_in_one_command(
    imagenet: tuple[Path, Path, dict[str, str]], tmp_path: Path, suffix: str
) -> None:
    root, csv, truth = imagenet
    dst = tmp_path / f"imagenet{suffix}"
    code, out, err = invoke(root, dst, "-q", "--labels", csv)
    assert code == 0, out + err
    assert (
        "class index: train: 3 class folders; "
        "val: labels file LOC_val_solution.csv, classes from train" in out
    )
    train = packer.open_dataset(dst, split="train", output="bytes")
    val = packer.open_dataset(dst, split="val", output="bytes")
    assert train.classes == val.classes == WNIDS
    assert sorted(val.keys) == sorted(truth)
    assert {k: val.classes[t] for k, t in zip(val.keys, val.targets.tolist())} == truth
    assert set(val.targets.tolist()) == {1, 2}  # n00000002 keeps train's index 1
    assert all(train.classes[t] == k.split("/")[0] for k, t in zip(train.keys, train.targets))
    shown = CliRunner().invoke(main, ["inspect", str(dst)]).output
    assert "class index: train: 3 class folders; val: labels file LOC_val_solution.csv" in shown


def test_labels_named_by_split_and_json_class_index(
    imagenet: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    root, csv, truth = imagenet
    dst = tmp_path / "imagenet.lmdb"
    code, out, err = invoke(root, dst, "-q", "--json", "--labels", f"val={csv}")
    assert code == 0, out + err
    summary = json.loads(out)
    assert summary["ok"] is True and summary["warnings"] == []
    assert summary["class_index"]["source"] == "splits"
    assert summary["class_index"]["splits"] == {
        "train": "3 class folders",
        "val": "labels file LOC_val_solution.csv, classes from train",
    }
    val = packer.open_dataset(dst, split="val")
    assert {k: WNIDS[t] for k, t in zip(val.keys, val.targets.tolist())} == truth


def test_one_split_takes_the_index_of_train(
    imagenet: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    """``--split val`` alone still indexes train's classes, though train is not converted."""
    root, csv, truth = imagenet
    dst = tmp_path / "val.npy"
    code, out, err = invoke(root, dst, "-q", "--split", "val", "--labels", csv)
    assert code == 0, out + err
    val = packer.open_dataset(dst, split="val")
    assert val.classes == WNIDS
    assert {k: WNIDS[t] for k, t in zip(val.keys, val.targets.tolist())} == truth


def break_flat_without_labels(root: Path, csv: Path) -> list[str]:
    return []


def break_unknown_class(root: Path, csv: Path) -> list[str]:
    csv.write_text(csv.read_text().replace("n00000003", "n99999999"))
    return ["--labels", str(csv)]


def break_empty(root: Path, csv: Path) -> list[str]:
    shutil.rmtree(root / "val")
    (root / "val").mkdir()
    return []


BROKEN = {
    "flat without labels": (
        break_flat_without_labels,
        r"split 'val': '.*val' holds 8 image\(s\) directly and no class folders: pass its "
        r"labels file with --labels FILE",
    ),
    "labels naming an unknown class": (
        break_unknown_class,
        r"split 'val': LOC_val_solution.csv: 4 image\(s\) have a label that is not a class of "
        r"the index \(3 classes, classes from train\).*'n99999999'",
    ),
    "empty": (break_empty, r"split 'val': '.*val' is empty: no class folders and no images"),
}


@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_val_fails_before_train_is_converted(
    imagenet: tuple[Path, Path, dict[str, str]], tmp_path: Path, broken: str
) -> None:
    root, csv, _ = imagenet
    damage, message = BROKEN[broken]
    extra = damage(root, csv)
    dst = tmp_path / "out.lmdb"
    code, out, err = invoke(root, dst, "-q", *extra)
    assert code == 1
    assert re.search(message, err), err
    assert nothing_written(dst)
    events: list[tuple[str, int]] = []
    with pytest.raises(SourceError, match=message):
        packer.convert(
            root,
            dst,
            progress=False,
            labels=extra[1] if extra else None,
            on_event=lambda name, n: events.append((name, n)),
        )
    assert events == [] and nothing_written(dst)


def test_labels_for_no_flat_split_or_for_a_missing_split(
    imagenet: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    root, csv, _ = imagenet
    dst = tmp_path / "out.lmdb"
    code, _, err = invoke(root, dst, "-q", "--labels", f"test={csv}")
    assert code == 1 and "has no split 'test'; it has train, val" in err
    code, _, err = invoke(root, dst, "-q", "--labels", f"train={csv}")
    assert code == 1 and "split 'train' holds class folders" in err
    (root / "test").mkdir()
    shutil.copy(next((root / "val").iterdir()), root / "test" / "a.JPEG")
    code, _, err = invoke(root, dst, "-q", "--labels", csv)
    assert code == 1 and "--labels val=FILE --labels test=FILE" in err
    assert nothing_written(dst)


def test_a_video_split_root_is_refused_before_any_work(tmp_path: Path) -> None:
    root = tmp_path / "ucf"
    make_video_tree(root / "train", classes=2, per_class=1, frames=(3, 4))
    make_video_tree(root / "val", classes=2, per_class=1, frames=(3, 4), seed=1)
    dst = tmp_path / "ucf.npy"
    code, _, err = invoke(root, dst, "-q")
    assert code == 1 and "looks like a tree of videos" in err and "--kind video" in err
    assert nothing_written(dst)


def test_a_flat_folder_alone_warns_that_its_index_comes_from_its_labels(
    imagenet: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    root, csv, truth = imagenet
    alone = tmp_path / "val.lmdb"
    code, out, err = invoke(root / "val", alone, "-q", "--labels", csv)
    assert code == 0, out + err
    assert "class index: labels file LOC_val_solution.csv alone" in out
    assert "warning:" in out and "--classes-from TRAIN_OUTPUT" in out
    shifted = packer.open_dataset(alone)
    assert shifted.classes == WNIDS[1:]  # n00000002 is 0 here, 1 in train: what it warns of
    code, out, err = invoke(root / "val", tmp_path / "v.lmdb", "-q", "--json", "--labels", csv)
    summary = json.loads(out)
    assert summary["class_index"]["source"] == "labels-file"
    assert [w["code"] for w in summary["warnings"]] == ["class-index-from-labels"]
    train = tmp_path / "train.lmdb"
    assert invoke(root / "train", train, "-q")[0] == 0
    pinned = tmp_path / "pinned.lmdb"
    code, out, err = invoke(
        root / "val", pinned, "-q", "--json", "--labels", csv, "--classes-from", train
    )
    summary = json.loads(out)
    assert summary["warnings"] == [] and summary["class_index"]["source"] == "given"
    val = packer.open_dataset(pinned)
    assert {k: WNIDS[t] for k, t in zip(val.keys, val.targets.tolist())} == truth


def test_json_failures_print_one_object(tmp_path: Path, tree: DemoTree) -> None:
    code, out, err = invoke(tmp_path / "missing", tmp_path / "o.lmdb", "--json")
    assert code == 1
    failure = json.loads(out)
    assert failure == {
        "ok": False,
        "error": f"source {str(tmp_path / 'missing')!r} does not exist",
        "type": "SourceError",
    }
    assert err.startswith("Error: source") and "{" not in err
    code, out, err = invoke(tree.root, tmp_path / "o.zip", "--json")
    assert code == 1 and "unknown destination suffix" in json.loads(out)["error"]
    code, out, err = invoke(tree.root, tmp_path / "o.zip")  # without --json: text only
    assert code == 1 and out == "" and "Error:" in err


def test_every_split_problem_is_reported_at_once(
    imagenet: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    root = imagenet[0]
    (root / "test").mkdir()
    (root / "val" / "n99999999").mkdir()  # val: now class folders, one unknown to train
    first = sorted((root / "val").glob("*.JPEG"))[0]
    shutil.copy(first, root / "val" / "n99999999" / "a.JPEG")
    dst = tmp_path / "out.lmdb"
    code, _, err = invoke(root, dst, "-q")
    assert code == 1
    assert "split 'val': " in err and "the class index does not know: 'n99999999'" in err
    assert "split 'test': " in err and "is empty" in err
    assert nothing_written(dst)
