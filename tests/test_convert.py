from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import packer
from packer.core.manifest import MANIFEST_NAME
from packer.demo.image import DemoTree
from packer.errors import DestinationError, InputFileError, PackerError
from packer.write.convert import plan_shards


def test_output_identical_for_any_worker_count(
    tree_files: Any, tree: DemoTree, tmp_path: Path, suffix: str
) -> None:
    one, two = tmp_path / f"one{suffix}", tmp_path / f"two{suffix}"
    packer.convert(tree.root, one, shard_size="20kB", workers=1, progress=False)
    packer.convert(tree.root, two, shard_size="20kB", workers=2, progress=False)
    files_one, files_two = tree_files(one), tree_files(two)
    assert len(files_one) > 3
    assert files_one == files_two


def test_broken_file_skipped_and_recorded(tree: DemoTree, packed: dict[str, Path]) -> None:
    manifest = json.loads((packed[".lmdb"] / MANIFEST_NAME).read_text())
    assert manifest["num_samples"] == len(tree.good)
    assert manifest["skipped"] == [
        {"path": str(tree.bad[0]), "reason": "truncated JPEG (no end-of-image marker)"}
    ]


def test_strict_fails_and_leaves_no_complete_output(tree: DemoTree, tmp_path: Path) -> None:
    dst = tmp_path / "strict.npy"
    with pytest.raises(InputFileError, match="broken_000.JPEG: truncated JPEG"):
        packer.convert(tree.root, dst, strict=True, workers=2, progress=False)
    assert not dst.exists()
    partial = tmp_path / "strict.npy.partial"
    assert not (partial / MANIFEST_NAME).exists()


def test_existing_destination_needs_overwrite(tree: DemoTree, tmp_path: Path) -> None:
    dst = tmp_path / "out.npy"
    packer.convert(tree.root, dst, progress=False)
    with pytest.raises(DestinationError, match="exists; pass --overwrite"):
        packer.convert(tree.root, dst, progress=False)
    result = packer.convert(tree.root, dst, overwrite=True, format="lmdb", progress=False)
    assert result.manifest.format == "lmdb"
    assert packer.open_dataset(dst).manifest.format == "lmdb"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy"]


def test_check_decode_also_accepts_good_files(tree: DemoTree, tmp_path: Path) -> None:
    result = packer.convert(tree.root, tmp_path / "d.h5", check="decode", progress=False)
    assert result.manifest.num_samples == len(tree.good)
    assert len(result.skipped) == 1
    assert "skipped 1 input(s)" in result.summary()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": 0}, "invalid workers 0"),
        ({"shard_size": "ten"}, "invalid size 'ten'"),
        ({"check": "paranoid"}, "invalid check"),
        ({"format": "zip"}, "unknown format 'zip'"),
    ],
)
def test_bad_arguments_refused_before_work(
    tree: DemoTree, tmp_path: Path, kwargs: dict, message: str
) -> None:
    with pytest.raises(PackerError, match=message):
        packer.convert(tree.root, tmp_path / "x.lmdb", progress=False, **kwargs)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_destination(tree: DemoTree, tmp_path: Path) -> None:
    with pytest.raises(DestinationError, match="does not exist"):
        packer.convert(tree.root, tmp_path / "no" / "such" / "x.lmdb", progress=False)


def test_plan_shards_rolls_by_size() -> None:
    shard_of, planned = plan_shards([5, 5, 5, 20, 1], shard_size=10)
    assert shard_of.tolist() == [0, 0, 1, 2, 3]
    assert planned == [10, 5, 20, 1]


def test_an_empty_class_is_refused_or_kept(tree: DemoTree, tmp_path: Path) -> None:
    import shutil

    src = Path(shutil.copytree(tree.root, tmp_path / "src"))
    (src / "class_01b").mkdir()  # sorts between class_01 and class_02
    with pytest.raises(PackerError, match="pass --allow-empty to keep them"):
        packer.convert(src, tmp_path / "x.npy", progress=False)
    packer.convert(src, tmp_path / "y.npy", allow_empty=True, progress=False)
    dataset = packer.open_dataset(tmp_path / "y.npy")
    assert dataset.classes == ["class_00", "class_01", "class_01b", "class_02"]
    assert 2 not in set(dataset.targets.tolist()) and 3 in set(dataset.targets.tolist())
    assert all(
        dataset.classes[dataset.targets[i]] == dataset.keys[i].split("/")[0]
        for i in range(len(dataset))
    )


def test_the_summary_says_what_was_detected(tree: DemoTree, tmp_path: Path) -> None:
    from packer.demo.video import make_video_tree

    text = packer.convert(tree.root, tmp_path / "i.npy", progress=False).summary()
    assert (
        f"image classes (detected: images in class folders): 3, {len(tree.good) + len(tree.bad)} image file(s)"
        in text
    )
    video = make_video_tree(tmp_path / "v", classes=2, per_class=1, frames=(3, 4))
    text = packer.convert(video.root, tmp_path / "v.npy", progress=False).summary()
    assert (
        "video (detected: 2 class(es) of numbered frame folders): 2 frame folder(s) and 0 video file(s) in 2 classes"
        in text
    )
    forced = packer.convert(tree.root, tmp_path / "f.npy", kind="image", progress=False)
    assert "image classes (given)" in forced.summary()
