"""Round trips through every format in the registry, through the public API."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packer
from packer.demo.image import DemoTree
from packer.errors import DestinationError
from packer.formats import FORMATS, format_for
from packer.formats import lmdb as lmdb_format


def source_bytes(tree: DemoTree) -> dict[str, bytes]:
    return {f"{p.parent.name}/{p.stem}": p.read_bytes() for p in tree.good}


def test_round_trip(tree: DemoTree, packed: dict[str, Path], suffix: str) -> None:
    """Encoded formats give back the source bytes exactly; BMP gives Pillow's RGB pixels."""
    dataset = packer.open_dataset(packed[suffix], output="bytes")
    expected = source_bytes(tree)
    assert len(dataset) == len(expected)
    assert sorted(dataset.keys) == sorted(expected)
    for i in range(len(dataset)):
        data, label = dataset[i]
        key = dataset.keys[i]
        assert label == dataset.class_to_idx[key.split("/")[0]]
        if suffix == ".bmp":
            pixels = np.asarray(packer.open_dataset(packed[suffix], output="numpy")[i][0])
            with Image.open(tree.root / (key + ".JPEG")) as src:
                assert np.array_equal(pixels, np.asarray(src.convert("RGB")))
        else:
            assert data == expected[key]


def test_small_shard_size_makes_several_shards(packed: dict[str, Path]) -> None:
    for suffix in (".lmdb", ".h5", ".npy"):
        manifest = packer.open_dataset(packed[suffix]).manifest
        assert len(manifest.shards) > 1
        assert sum(s.samples for s in manifest.shards) == manifest.num_samples


def test_registry_lookup_lists_valid_suffixes() -> None:
    assert format_for("out.LMDB/").NAME == "lmdb"
    assert format_for("x.hdf5") is FORMATS[".h5"]
    with pytest.raises(DestinationError, match=r"'\.zip'.*\.bmp, \.h5, \.hdf5, \.lmdb, \.npy"):
        format_for("out.zip")


def test_lmdb_map_grows_when_full(
    tree: DemoTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A map size far too small still converts: the writer grows the map on MapFullError."""
    monkeypatch.setattr(lmdb_format, "initial_map_size", lambda planned: 64 * 1024)
    dst = tmp_path / "small.lmdb"
    packer.convert(tree.root, dst, workers=1, progress=False)
    dataset = packer.open_dataset(dst, output="bytes")
    expected = source_bytes(tree)
    assert [dataset[i][0] for i in range(len(dataset))] == [expected[k] for k in dataset.keys]


def test_lmdb_reader_without_readahead(packed: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(packed[".lmdb"], tmp_path / "x.lmdb"))  # no env open yet
    off = packer.LMDBDataset(root, output="bytes", readahead=False)
    got = [off[i] for i in range(len(off))]
    assert off.reader._shard(0)._shared.env.flags()["readahead"] is False
    on = packer.LMDBDataset(packed[".lmdb"], output="bytes")
    assert got == [on[i] for i in range(len(on))]
    again = packer.LMDBDataset(root, output="bytes")  # shares the first opener's environment
    assert [again[i] for i in range(len(again))] == got


def test_npy_shards_load_with_numpy(packed: dict[str, Path]) -> None:
    dataset = packer.open_dataset(packed[".npy"], output="bytes")
    shard = np.load(packed[".npy"] / dataset.manifest.shards[0].name, mmap_mode="r")
    assert shard.dtype == np.uint8 and shard.ndim == 1
    reader = dataset.reader
    start = int(reader.offset[0]) - 128  # records.npy holds file offsets; the header is 128 B
    assert shard[start : start + int(reader.length[0])].tobytes() == dataset[0][0]
