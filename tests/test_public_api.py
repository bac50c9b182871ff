"""The public API people hold: every name in ``packer.__all__`` resolves, and the names a user
catches or calls are the real classes and functions (not modules of the same name)."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

import packer
from packer import errors


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
    assert packer.NpyDataset is packer.NPYDataset
    assert packer.NpyVideoDataset is packer.NPYVideoDataset
    assert packer.VideoFolderDataset is packer.FolderVideoDataset
