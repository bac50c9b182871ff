"""The public API people hold: every name in ``packer.__all__`` resolves, and the names a user
catches or calls are the real classes and functions (not modules of the same name)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

import packer
from packer import errors
from packer.demo.image import DemoTree, make_image_tree


@pytest.mark.parametrize("name", packer.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(packer, name) is not None


def test_errors_are_public_and_one_family() -> None:
    for cls in (
        packer.SourceError,
        packer.DestinationError,
        packer.FormatError,
        packer.InputFileError,
    ):
        assert issubclass(cls, packer.PackerError)
    public = {n for n in packer.__all__ if n.endswith("Error")}
    defined = {
        n for n, v in vars(errors).items() if inspect.isclass(v) and issubclass(v, Exception)
    }
    assert defined <= public


def test_merge_and_verify_are_functions() -> None:
    assert inspect.isfunction(packer.merge) and inspect.isfunction(packer.verify)
    assert inspect.isclass(packer.VerifyReport) and inspect.isclass(packer.Problem)


TABLES = ("index.npy", "records.npy", "keys.txt")  # the dataset's own index: mapped while it lives


def _held(root: Path) -> list[str]:
    """Data files under ``root`` this process holds (open descriptors and memory maps): shards
    and per-sample files, not the tables."""
    root_s = str(root.resolve())
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root_s):
            held.append(target)
    with open("/proc/self/maps") as maps:
        held += [line.split()[-1] for line in maps if root_s in line]
    return [path for path in held if os.path.basename(path) not in TABLES]


def test_close_and_with_release_every_file(packed: dict[str, Path], suffix: str) -> None:
    root = packed[suffix]
    with packer.open_dataset(root, output="bytes") as dataset:
        data = [dataset[i][0] for i in range(len(dataset))]
        assert _held(root), "reading held no file: the test would prove nothing"
    assert _held(root) == []
    assert dataset[0][0] == data[0]  # still usable: it reopens what it needs
    dataset.close()
    assert _held(root) == []


def test_one_naming_scheme_with_the_old_names_kept() -> None:
    """<FORMAT>Dataset for images, <FORMAT>VideoDataset for clips, Folder being a format."""
    for fmt in ("LMDB", "HDF5", "NPY", "BMP", "Folder"):
        for kind in ("", "Video"):
            cls = getattr(packer, f"{fmt}{kind}Dataset")
            assert cls.__name__ == f"{fmt}{kind}Dataset"
    for old, new in [
        ("NpyDataset", "NPYDataset"),
        ("NpyVideoDataset", "NPYVideoDataset"),
        ("VideoFolderDataset", "FolderVideoDataset"),
    ]:
        with pytest.warns(
            DeprecationWarning, match=f"packer.{old} is the old name of packer.{new}"
        ):
            assert getattr(packer, old) is getattr(packer, new)
        assert old not in packer.__all__
    with pytest.warns(DeprecationWarning, match="NpyVideoDataset"):
        from packer.video import NpyVideoDataset  # noqa: F401


def test_open_dataset_checks_the_kind_asked_for(packed: dict[str, Path], tmp_path: Path) -> None:
    from packer.demo.video import make_video_tree

    image = packer.open_dataset(packed[".lmdb"], kind="image")
    assert isinstance(image, packer.LMDBDataset)
    with pytest.raises(
        packer.FormatError, match="holds images, not videos: open it with kind='image'"
    ):
        packer.open_dataset(packed[".lmdb"], kind="video")
    videos = make_video_tree(tmp_path / "videos", classes=2, per_class=1, frames=(4, 5))
    clips = packer.open_dataset(videos.root, kind="video", num_frames=2)
    assert isinstance(clips, packer.FolderVideoDataset)
    with pytest.raises(packer.FormatError, match="holds videos, not images"):
        packer.open_dataset(videos.root, kind="image")
    with pytest.raises(packer.PackerError, match="unknown kind 'clip'"):
        packer.open_dataset(videos.root, kind="clip")


class _Subset(packer.FolderDataset):
    """torchvision-style hooks: the last class only, at index 0; only the first 2 images."""

    def find_classes(self, directory):  # type: ignore[no-untyped-def]
        classes, _ = super().find_classes(directory)
        return classes[-1:], {classes[-1]: 0}

    def make_dataset(self, directory, class_to_idx, is_valid_file=None):  # type: ignore[no-untyped-def]
        return super().make_dataset(directory, class_to_idx, is_valid_file)[:2]


def test_folder_dataset_hooks(tree: DemoTree) -> None:
    from PIL import Image

    plain = packer.FolderDataset(tree.root)
    last = plain.classes[-1]
    subset = _Subset(tree.root, output="pil")
    assert subset.classes == [last] and subset.class_to_idx == {last: 0}
    expected = [p for p in plain.paths if Path(p).parent.name == last][:2]
    assert list(subset.paths) == expected and list(subset.targets) == [0, 0]
    assert [k.split("/")[0] for k in subset.keys] == [last, last]
    gray = packer.FolderDataset(tree.root, loader=lambda p: Image.open(p).convert("L"))
    good = next(i for i, p in enumerate(plain.paths) if Path(p) not in tree.bad)
    image, label = gray[good]
    assert image.mode == "L" and label == plain[good][1]
    assert image.size == plain[good][0].size
    with pytest.raises(packer.PackerError, match="does not apply with loader="):
        packer.FolderDataset(tree.root, output="bytes", loader=open)


def test_folder_dataset_loader_errors_are_skippable(tree: DemoTree) -> None:
    def picky(path: str) -> str:
        if path == first:
            raise OSError("cannot read")
        return path

    first = packer.FolderDataset(tree.root).paths[0]
    with pytest.raises(packer.InputFileError, match="cannot be loaded: cannot read"):
        packer.FolderDataset(tree.root, loader=picky)[0]
    skipping = packer.FolderDataset(tree.root, loader=picky, on_error="skip")
    assert skipping[0][0] != first and skipping.replaced == 1


def test_folder_keys_follow_the_scan_rule_also_for_custom_samples(tmp_path: Path) -> None:
    """Keys are the paths' by the scan's rule (the suffix kept where two images share a stem),
    equal to a conversion's; a custom make_dataset's samples get keys by the same rule."""
    tree = make_image_tree(tmp_path / "src", classes=2, per_class=2, size=(32, 24), bad=0)
    first = sorted((tree.root / "class_00").iterdir())[0]
    twin = first.with_suffix(".png")
    from PIL import Image

    Image.open(first).save(twin)
    plain = packer.FolderDataset(tree.root, output="bytes")
    packed = packer.convert(tree.root, tmp_path / "out.npy", workers=1, progress=False)
    converted = packer.open_dataset(packed.dst, output="bytes")
    assert list(plain.keys) == list(converted.keys)
    assert f"class_00/{first.name}" in plain.keys and f"class_00/{twin.name}" in plain.keys

    class Twins(packer.FolderDataset):
        def make_dataset(self, directory, class_to_idx, is_valid_file=None):  # type: ignore[no-untyped-def]
            return [(str(first), 0), (str(twin), 0), (str(first), 0)]

    keys = list(Twins(tree.root).keys)
    assert keys == [f"class_00/{first.name}", f"class_00/{twin.name}", f"class_00/{first.name}~2"]


def test_merge_takes_a_url_and_merge_to_url_is_exported(tmp_path: Path) -> None:
    """packer.merge joins a URL's staged parts too (tests/test_remote_write.py); the URL-only
    options on a local path are refused; the lower merge of local parts names the way."""
    from packer.upload.staging import merge_to_url
    from packer.write.merge import merge as merge_local

    assert packer.merge_to_url is merge_to_url and "merge_to_url" in packer.__all__
    with pytest.raises(packer.PackerError, match="are for a URL; .* is a local path"):
        packer.merge(tmp_path / "out.lmdb", staging=tmp_path)
    with pytest.raises(packer.DestinationError, match=r"use packer.merge_to_url\(url"):
        merge_local("s3://bucket/out.lmdb")
