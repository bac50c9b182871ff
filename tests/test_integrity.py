"""A reader serves the files it was opened on, or refuses: never the wrong image.

Attacks: re-converting a path with --overwrite while a dataset of it is open (read from or not),
reopening after an overwrite in the same process, and thousands of open/drop cycles."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import packer
from packer.decode.outputs import decode
from packer.demo.image import DemoTree, make_image_tree

FORMATS = (".lmdb", ".npy", ".h5", ".bmp")


def by_key(tree: DemoTree) -> dict[str, bytes]:
    return {f"{p.parent.name}/{p.stem}": p.read_bytes() for p in tree.good}


@pytest.fixture(scope="module")
def two_trees(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoTree, DemoTree]:
    """Same keys and labels, different pixels."""
    base = tmp_path_factory.mktemp("two")
    old = make_image_tree(base / "old", classes=2, per_class=6, size=(64, 48), bad=0, seed=1)
    new = make_image_tree(base / "new", classes=2, per_class=6, size=(64, 48), bad=0, seed=2)
    assert by_key(old).keys() == by_key(new).keys() and by_key(old) != by_key(new)
    return old, new


def convert(src: DemoTree, dst: Path, overwrite: bool = False) -> None:
    packer.convert(src.root, dst, shard_size="6kB", workers=1, progress=False, overwrite=overwrite)


def stored(dataset: packer.LMDBDataset, i: int) -> bytes:
    data = dataset[i][0]
    if dataset.manifest.format == "bmp":  # decoded: compare pixels through a fresh decode
        return decode(data, "numpy").tobytes()
    return data


def expected(tree: DemoTree, key: str, fmt: str) -> bytes:
    data = by_key(tree)[key]
    if fmt == ".bmp":
        return decode(data, "numpy").tobytes()
    return data


@pytest.mark.parametrize("fmt", FORMATS)
def test_reopen_after_overwrite_reads_the_new_data(
    two_trees: tuple[DemoTree, DemoTree], tmp_path: Path, fmt: str
) -> None:
    old, new = two_trees
    dst = tmp_path / f"out{fmt}"
    convert(old, dst)
    first = packer.open_dataset(dst, output="bytes")
    assert all(stored(first, i) == expected(old, first.keys[i], fmt) for i in range(len(first)))
    del first
    convert(new, dst, overwrite=True)
    again = packer.open_dataset(dst, output="bytes")
    assert all(stored(again, i) == expected(new, again.keys[i], fmt) for i in range(len(again)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_overwrite_while_open_never_mixes(
    two_trees: tuple[DemoTree, DemoTree], tmp_path: Path, fmt: str
) -> None:
    old, new = two_trees
    dst = tmp_path / f"out{fmt}"
    convert(old, dst)
    untouched = packer.open_dataset(dst, output="bytes")  # opened, nothing read yet
    half_read = packer.open_dataset(dst, output="bytes")
    for i in range(0, len(half_read), 2):
        stored(half_read, i)
    convert(new, dst, overwrite=True)
    with pytest.raises(packer.FormatError, match="replaced after the dataset was opened"):
        stored(untouched, 0)
    served = 0
    for i in range(len(half_read)):
        try:
            data = stored(half_read, i)
        except packer.FormatError as exc:
            assert "replaced after the dataset was opened" in str(exc)
            continue
        assert data == expected(old, half_read.keys[i], fmt)  # the old files, consistently
        served += 1
    if fmt != ".bmp":  # a BMP file is opened per read: the old folder is gone
        assert served > 0


def test_thousands_of_open_drop_cycles_keep_descriptors_flat(
    two_trees: tuple[DemoTree, DemoTree], tmp_path: Path
) -> None:
    old, _ = two_trees
    roots = []
    for fmt in (".lmdb", ".npy", ".h5"):
        roots.append(tmp_path / f"out{fmt}")
        convert(old, roots[-1])

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    for root in roots:
        packer.open_dataset(root, output="bytes")[0]
    before = descriptors()
    for n in range(5000):
        dataset = packer.open_dataset(roots[n % 3], output="bytes")
        dataset.__getitems__([0, len(dataset) - 1])
        del dataset
    assert descriptors() <= before + 2
