from __future__ import annotations

import os
from pathlib import Path

import pytest

from packer.errors import SourceError
from packer.source.images import natural_key, scan


def touch(path: Path, data: bytes = b"x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def test_classes_sorted_and_samples_in_imagefolder_order(tmp_path: Path) -> None:
    for name in ["b/2.jpg", "b/10.JPG", "a/z.png", "a/y.JPEG", "c/x.webp"]:
        touch(tmp_path / name)
    result = scan(tmp_path)
    assert result.classes == ["a", "b", "c"]
    assert result.class_to_idx == {"a": 0, "b": 1, "c": 2}
    assert [s.key for s in result.samples] == ["a/y", "a/z", "b/10", "b/2", "c/x"]
    assert [s.label for s in result.samples] == [0, 0, 1, 1, 2]
    assert all(s.size == 1 for s in result.samples)


def test_hidden_and_non_image_files_ignored(tmp_path: Path) -> None:
    touch(tmp_path / "a/1.jpg")
    touch(tmp_path / "a/.hidden.jpg")
    touch(tmp_path / "a/notes.txt")
    touch(tmp_path / ".git/x.jpg")
    touch(tmp_path / "root-level.jpg")
    result = scan(tmp_path)
    assert result.classes == ["a"]
    assert [s.key for s in result.samples] == ["a/1"]
    assert result.ignored == 1


def test_same_stem_keeps_extension_in_key(tmp_path: Path) -> None:
    touch(tmp_path / "a/1.jpg")
    touch(tmp_path / "a/1.png")
    touch(tmp_path / "a/2.jpg")
    assert [s.key for s in scan(tmp_path).samples] == ["a/1.jpg", "a/1.png", "a/2"]


def test_broken_symlink_recorded_as_skipped(tmp_path: Path) -> None:
    touch(tmp_path / "a/1.jpg")
    os.symlink(tmp_path / "a/missing.jpg", tmp_path / "a/link.jpg")
    result = scan(tmp_path)
    assert [s.key for s in result.samples] == ["a/1"]
    assert [Path(s.path).name for s in result.skipped] == ["link.jpg"]


@pytest.mark.parametrize(
    "layout, message",
    [
        (None, "does not exist"),
        ("file", "is a file"),
        ("empty", "no class folders"),
        ("noimages", "no images"),
        ("oneempty", "have no images: 'b'"),
    ],
)
def test_bad_sources_are_clear_errors(tmp_path: Path, layout: str | None, message: str) -> None:
    root = tmp_path / "src"
    if layout == "file":
        touch(root)
    elif layout == "empty":
        root.mkdir()
    elif layout == "noimages":
        touch(root / "a/readme.txt")
    elif layout == "oneempty":
        touch(root / "a/1.jpg")
        (root / "b").mkdir()
    with pytest.raises(SourceError, match=message):
        scan(root)


def test_natural_key_orders_numbers() -> None:
    names = ["img_10.jpg", "img_2.jpg", "img_1.jpg"]
    assert sorted(names, key=natural_key) == ["img_1.jpg", "img_2.jpg", "img_10.jpg"]


def test_stray_subfolder_does_not_make_an_image_tree_video(tmp_path: Path) -> None:
    from packer.source.detect import detect_kind

    touch(tmp_path / "a/1.jpg")
    (tmp_path / "a/thumbnails").mkdir()
    touch(tmp_path / "a/notes/readme.txt")
    assert detect_kind(tmp_path) == "image"
    touch(tmp_path / "b/clip/img_1.jpg")
    with pytest.raises(SourceError, match="could be either kind.*pass --kind image"):
        detect_kind(tmp_path)
