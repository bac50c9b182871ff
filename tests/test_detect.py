"""Kind detection is never silent and never a guess, and image classes are walked like
torchvision's ImageFolder (nested sub-folders, symlinked folders, loops detected)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.demo.image import DemoTree
from packer.demo.video import make_video_files, make_video_tree
from packer.errors import SourceError
from packer.source.detect import detect_kind
from packer.source.images import IMAGE_EXTENSIONS, scan


def jpeg(tree: DemoTree) -> bytes:
    return tree.good[0].read_bytes()


def put(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def imagefolder_order(root: Path) -> list[tuple[str, int]]:
    """An independent reference: torchvision's make_dataset, written from its documented rule
    (classes = sorted first-level folders; per class, sorted(os.walk(followlinks=True)), sorted
    file names, allowed extensions), hidden entries left out as packer does."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    out = []
    for label, name in enumerate(classes):
        for folder, _dirs, files in sorted(os.walk(root / name, followlinks=True)):
            if any(part.startswith(".") for part in Path(folder).relative_to(root).parts):
                continue
            for f in sorted(files):
                if not f.startswith(".") and os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS:
                    out.append((os.path.relpath(os.path.join(folder, f), root), label))
    return out


def test_kind_detection_table(tree: DemoTree, tmp_path: Path) -> None:
    data = jpeg(tree)
    imagenet = tmp_path / "imagenet"  # class/xxx.JPEG
    for c in ("n01440764", "n01443537"):
        for i in range(3):
            put(imagenet / c / f"{c}_{i}.JPEG", data)
    assert detect_kind(imagenet) == "image"
    nested = tmp_path / "nested"  # a class tree with nested sub-folders beside images
    put(nested / "cat" / "a.jpg", data)
    put(nested / "cat" / "more" / "b.jpg", data)
    put(nested / "dog" / "c.jpg", data)
    assert detect_kind(nested) == "image"
    ucf = make_video_tree(tmp_path / "ucf", classes=2, per_class=2).root  # class/video/img_N.jpg
    assert detect_kind(ucf) == "video"
    kinetics = tmp_path / "kinetics"  # class/youtubeid_000010_000020.mp4
    make_video_files(kinetics, classes=2, per_class=1)
    assert detect_kind(kinetics) == "video"
    either = tmp_path / "either"  # classes holding only sub-folders of unnumbered images
    put(either / "cat" / "indoor" / "kitten.jpg", data)
    put(either / "cat" / "outdoor" / "tabby.jpg", data)
    put(either / "dog" / "park" / "rex.jpg", data)
    with pytest.raises(SourceError, match="could be either kind.*--kind image.*--kind video"):
        detect_kind(either)
    half = tmp_path / "half"  # one image class, one class of numbered frame folders
    put(half / "a" / "x.jpg", data)
    put(half / "b" / "clip" / "img_00001.jpg", data)
    with pytest.raises(SourceError, match="class 'a' looks like an image class but class 'b'"):
        detect_kind(half)
    mixed = tmp_path / "mixed"
    put(mixed / "a" / "x.jpg", data)
    put(mixed / "a" / "y.mp4", b"x")
    with pytest.raises(SourceError, match="holds both images and videos"):
        detect_kind(mixed)


def test_the_summary_says_what_was_detected_and_why(tree: DemoTree, tmp_path: Path) -> None:
    ucf = make_video_tree(tmp_path / "ucf", classes=2, per_class=1).root
    out = CliRunner().invoke(main, ["convert", str(ucf), str(tmp_path / "v.npy"), "-q"]).output
    assert "video (detected: 2 class(es) of numbered frame folders): 2 frame folder(s)" in out
    out = CliRunner().invoke(main, ["convert", str(tree.root), str(tmp_path / "i.npy"), "-q"])
    assert "image classes (detected: images in class folders): 3," in out.output


def test_an_ambiguous_tree_asks_for_kind_and_converts_either_way(
    tree: DemoTree, tmp_path: Path
) -> None:
    data = jpeg(tree)
    src = tmp_path / "either"
    put(src / "cat" / "indoor" / "kitten.jpg", data)
    put(src / "cat" / "outdoor" / "tabby.jpg", data)
    put(src / "dog" / "park" / "rex.jpg", data)
    result = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "a.lmdb"), "-q"])
    assert result.exit_code != 0 and "pass --kind image" in result.output
    assert not (tmp_path / "a.lmdb").exists()
    ok = CliRunner().invoke(
        main, ["convert", str(src), str(tmp_path / "img.lmdb"), "-q", "--kind", "image"]
    )
    assert ok.exit_code == 0, ok.output
    images = packer.open_dataset(tmp_path / "img.lmdb", output="bytes")
    assert list(images.keys) == ["cat/indoor/kitten", "cat/outdoor/tabby", "dog/park/rex"]
    ok = CliRunner().invoke(
        main, ["convert", str(src), str(tmp_path / "vid.npy"), "-q", "--kind", "video"]
    )
    assert ok.exit_code == 0, ok.output
    assert len(packer.open_video_dataset(tmp_path / "vid.npy")) == 3


def test_nested_class_folders_match_imagefolder(tree: DemoTree, tmp_path: Path) -> None:
    data = jpeg(tree)
    src = tmp_path / "src"
    for rel in [
        "b/z.jpg",
        "b/a/y.jpg",
        "b/a b/x.jpg",  # ' ' sorts before '/': "a b" comes after "a" but before "a/deep"
        "b/a/deep/w.png",
        "a/1.jpg",
        "a/sub/2.jpg",
        "a/sub/notes.txt",
        "a/.hidden/3.jpg",
    ]:
        put(src / rel, data)
    os.symlink(src / "b" / "a", src / "a" / "linked")  # a symlinked folder is followed
    os.symlink(src / "a", src / "a" / "sub" / "loop")  # a loop back up is detected, not walked
    result = scan(src)
    got = [(os.path.relpath(s.path, src), s.label) for s in result.samples]
    assert got == [p for p in imagefolder_order_without_loops(src)]
    assert [s.key for s in result.samples][:3] == ["a/1", "a/linked/y", "a/linked/deep/w"]
    assert any("symlink loop" in s.reason and s.path.endswith("loop") for s in result.skipped)
    dst = tmp_path / "out.npy"
    packer.convert(src, dst, progress=False)
    ds = packer.open_dataset(dst, output="bytes")
    assert len(ds) == len(got) and ds[len(ds) - 1][0] == data


def imagefolder_order_without_loops(root: Path) -> list[tuple[str, int]]:
    """The reference order, with the one loop link removed (os.walk would recurse into it)."""
    link = root / "a" / "sub" / "loop"
    target = os.readlink(link)
    link.unlink()
    try:
        return imagefolder_order(root)
    finally:
        os.symlink(target, link)
