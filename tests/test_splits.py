"""ImageNet as it ships: a root of split folders converts into one output with one class index."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.demo.image import DemoTree
from packer.errors import PackerError, SourceError
from packer.read.verify import verify


@pytest.fixture
def imagenet(tree: DemoTree, tmp_path: Path) -> Path:
    """``train/`` with 3 classes; ``val/`` lacking ``class_01`` (its index must not shift)."""
    root = tmp_path / "imagenet"
    shutil.copytree(tree.root, root / "train")
    shutil.copytree(tree.root, root / "val", ignore=shutil.ignore_patterns("broken*"))
    shutil.rmtree(root / "val" / "class_01")
    return root


def walk_count(root: Path) -> int:
    return sum(1 for _, _, files in os.walk(root) for f in files if not f.startswith("broken"))


@pytest.mark.parametrize("suffix", [".lmdb", ".npy"])
def test_a_split_root_converts_with_one_class_index(
    imagenet: Path, tmp_path: Path, suffix: str
) -> None:
    dst = tmp_path / f"out{suffix}"
    result = packer.convert(imagenet, dst, progress=False)
    assert "image classes: 3 in splits train, val" in result.summary()
    assert "from 'train'" in result.summary()
    train = packer.open_dataset(dst, split="train", output="bytes")
    val = packer.open_dataset(dst, split="val", output="bytes")
    assert train.class_to_idx == val.class_to_idx == {"class_00": 0, "class_01": 1, "class_02": 2}
    assert len(train) == walk_count(imagenet / "train") and len(val) == walk_count(imagenet / "val")
    assert set(val.targets.tolist()) == {0, 2}  # class_02 keeps index 2 without class_01
    assert all(val.classes[val.targets[i]] == val.keys[i].split("/")[0] for i in range(len(val)))
    alone = packer.open_dataset(dst / "val", output="bytes")  # each split readable on its own
    assert len(alone) == len(val)
    with pytest.raises(PackerError, match="holds splits train, val: pass split="):
        packer.open_dataset(dst)
    with pytest.raises(PackerError, match="has no split 'test'"):
        packer.open_dataset(dst, split="test")
    assert verify(dst, progress=False).ok
    out = CliRunner().invoke(main, ["inspect", str(dst)]).output
    assert "2 splits, 3 classes" in out and f"val: {len(val)} samples" in out


def test_one_split_and_unknown_classes(imagenet: Path, tmp_path: Path) -> None:
    packer.convert(imagenet, tmp_path / "val.lmdb", split="val", progress=False)
    assert len(packer.open_dataset(tmp_path / "val.lmdb", split="val")) == walk_count(
        imagenet / "val"
    )
    with pytest.raises(PackerError, match="has no split 'valid'; it has train, val"):
        packer.convert(imagenet, tmp_path / "x.lmdb", split="valid", progress=False)
    (imagenet / "val" / "n99999999").mkdir()
    (imagenet / "val" / "n99999999" / "a.JPEG").write_bytes(b"x")
    with pytest.raises(
        SourceError, match="class folder.s. the class index does not know: 'n99999999'"
    ):
        packer.convert(imagenet, tmp_path / "y.lmdb", progress=False)


def test_a_split_root_is_never_taken_for_video(imagenet: Path, tmp_path: Path) -> None:
    folder = packer.open_dataset(imagenet, split="train", output="bytes")
    assert type(folder).__name__ == "FolderDataset" and len(folder.classes) == 3
    (imagenet / "extra").mkdir()
    with pytest.raises(SourceError, match="split folders .train, val. next to other folders"):
        packer.convert(imagenet, tmp_path / "z.lmdb", progress=False)


def test_an_interrupted_split_conversion_resumes(
    imagenet: Path, tmp_path: Path, tree_files
) -> None:  # type: ignore[no-untyped-def]
    reference = tmp_path / "ref.npy"
    packer.convert(imagenet, reference, progress=False, shard_size="15kB")
    dst = tmp_path / "out.npy"

    def stop(name: str, number: int) -> None:
        if name == "shard" and number == 1 and (tmp_path / "out.npy.partial" / "train").is_dir():
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        packer.convert(imagenet, dst, progress=False, shard_size="15kB", on_event=stop)
    assert not dst.exists()
    packer.convert(imagenet, dst, progress=False, shard_size="15kB", resume=True)
    assert tree_files(dst) == tree_files(reference)


def test_cli_converts_a_split_root_and_one_split(imagenet: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(main, ["convert", str(imagenet), str(tmp_path / "all.npy"), "-q"])
    assert done.exit_code == 0, done.output
    assert "in splits train, val" in done.output
    one = runner.invoke(
        main, ["convert", str(imagenet), str(tmp_path / "v.npy"), "-q", "--split", "val"]
    )
    assert one.exit_code == 0, one.output
    assert "splits val " in one.output or "in splits val" in one.output


def test_strict_names_each_split_with_a_bad_file_before_writing(
    imagenet: Path, tmp_path: Path
) -> None:
    """--strict on a root of splits: a split whose scan skips a file (a broken link) is named
    with it before anything is written, every such split at once; a truncated JPEG, found
    while writing, stops the conversion naming the file, and nothing is published."""
    for split in ("train", "val"):
        os.symlink(tmp_path / "nowhere.jpg", imagenet / split / "class_00" / "gone.jpg")
    dst = tmp_path / "out.lmdb"
    with pytest.raises(SourceError) as caught:
        packer.convert(imagenet, dst, strict=True, progress=False, workers=1)
    lines = str(caught.value).splitlines()
    assert [line.split(":")[0] for line in lines] == ["split 'train'", "split 'val'"]
    assert all("gone.jpg" in line and line.endswith("(--strict)") for line in lines)
    assert not list(tmp_path.glob("out.lmdb*"))
    for split in ("train", "val"):
        (imagenet / split / "class_00" / "gone.jpg").unlink()
    with pytest.raises(packer.InputFileError, match=r"train/class_\d+/broken.*\(--strict\)"):
        packer.convert(imagenet, dst, strict=True, progress=False, workers=1)
    assert not dst.exists()


def test_resume_of_a_published_root_of_splits_checks_its_inputs(
    imagenet: Path, tmp_path: Path
) -> None:
    """--resume on a published root of splits answers 'nothing to do' only while no input was
    modified after its split was written; an input rewritten since is refused (as for one
    folder's output), never silently kept."""
    dst = tmp_path / "out.npy"
    packer.convert(imagenet, dst, progress=False, workers=1)
    again = packer.convert(imagenet, dst, resume=True, progress=False, workers=1)
    assert again.manifest.kind == "splits"
    image = next((imagenet / "val").rglob("*.JPEG"))
    later = (dst / "val" / "packer.json").stat().st_mtime_ns + 10**9
    os.utime(image, ns=(later, later))
    with pytest.raises(PackerError, match="exists"):
        packer.convert(imagenet, dst, resume=True, progress=False, workers=1)
