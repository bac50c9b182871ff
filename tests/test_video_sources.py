"""Video source scanning and kind detection."""

from __future__ import annotations

from pathlib import Path

import pytest

from packer.demo.image import make_image_tree
from packer.errors import SourceError
from packer.source.detect import detect_kind
from packer.source.videos import scan_videos


def touch_frames(folder: Path, names: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"\xff\xd8 not checked by the scan \xff\xd9")


def test_frames_in_natural_order_and_keys(tmp_path: Path) -> None:
    touch_frames(tmp_path / "b" / "v1", ["img_10.jpg", "img_2.jpg", "img_1.jpg", "notes.txt"])
    touch_frames(tmp_path / "a" / "v0", ["f.jpg"])
    (tmp_path / "a" / "clip.mp4").write_bytes(b"x")
    result = scan_videos(tmp_path)
    assert result.classes == ["a", "b"]
    assert [v.key for v in result.videos] == ["a/clip", "a/v0", "b/v1"]
    assert [v.label for v in result.videos] == [0, 0, 1]
    assert result.videos[0].is_file and result.videos[0].frames is None
    assert [Path(p).name for p in result.videos[2].frames or ()] == [
        "img_1.jpg",
        "img_2.jpg",
        "img_10.jpg",
    ]
    assert result.ignored == 1
    assert result.num_files == 5


def test_detect_kind(tmp_path: Path) -> None:
    images = make_image_tree(tmp_path / "img", classes=2, per_class=1, size=(48, 48), bad=0)
    assert detect_kind(images.root) == "image"
    touch_frames(tmp_path / "vid" / "a" / "v0", ["1.jpg"])
    assert detect_kind(tmp_path / "vid") == "video"
    with pytest.raises(SourceError, match="does not exist"):
        detect_kind(tmp_path / "missing")


def test_mixed_tree_is_a_clear_error(tmp_path: Path) -> None:
    touch_frames(tmp_path / "a" / "v0", ["1.jpg"])
    touch_frames(tmp_path / "b", ["1.jpg"])
    with pytest.raises(SourceError, match="could be either kind: class 'b' looks like an image"):
        detect_kind(tmp_path)
    with pytest.raises(SourceError, match="class 'b' holds images directly"):
        scan_videos(tmp_path)
    touch_frames(
        tmp_path / "b" / "v1", ["1.jpg"]
    )  # b: images with a nested folder, ImageFolder-style
    with pytest.raises(SourceError, match="class 'b' holds images directly"):
        scan_videos(tmp_path)
    (tmp_path / "b" / "clip.mp4").write_bytes(b"x")  # b now holds images and a video file
    with pytest.raises(SourceError, match="holds both images and videos"):
        scan_videos(tmp_path)


def test_empty_video_folder_skipped_and_recorded(tmp_path: Path) -> None:
    touch_frames(tmp_path / "a" / "v0", ["1.jpg"])
    (tmp_path / "a" / "v1").mkdir()
    result = scan_videos(tmp_path)
    assert [v.key for v in result.videos] == ["a/v0"]
    assert [(Path(s.path).name, s.reason) for s in result.skipped] == [
        ("v1", "video folder has no frames")
    ]


def test_class_without_videos_and_image_tree_are_errors(tmp_path: Path) -> None:
    touch_frames(tmp_path / "a" / "v0", ["1.jpg"])
    (tmp_path / "b" / "empty").mkdir(parents=True)
    with pytest.raises(SourceError, match="have no videos: 'b'"):
        scan_videos(tmp_path)
    images = make_image_tree(tmp_path / "img", classes=1, per_class=1, size=(48, 48), bad=0)
    with pytest.raises(SourceError, match="holds images, not videos"):
        scan_videos(images.root)
