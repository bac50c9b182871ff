"""Class-folder outputs stay what they were before samples had fields (issue 30: "byte-identical
to today's"): the tables that depend only on names and labels are pinned by digest, the
manifest holds no field options, and every shard holds the source files' bytes in key order,
one record each, laid out as before (NPY: one uint8 array of the files back to back)."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import numpy as np
import pytest
import xxhash

import packer
from packer.demo.image import make_image_tree

# xxh3-64 of the tables of a 3-class × 4-image tree, as converted before fields existed
PINNED = {"index.npy": "f044923e9d0bc17e", "keys.txt": "f51eeeb6c3731e54"}
CLASS_OPTIONS = {"layout", "shard_size", "check", "max_file_size", "max_pixels", "storage"}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layout") / "src"
    return make_image_tree(root, classes=3, per_class=4, size=(64, 48), bad=0).root


@pytest.mark.parametrize("suffix", [".npy", ".lmdb", ".h5"])
def test_class_folder_output_is_laid_out_as_before(suffix: str, tree: Path, tmp_path: Path) -> None:
    dst = packer.convert(tree, tmp_path / f"o{suffix}", progress=False).dst
    names = ("index.npy", "keys.txt", "packer.json", "records.npy")
    assert sorted(p.name for p in dst.iterdir()) == sorted(names + (_shard(suffix),))
    for name, digest in PINNED.items():
        assert xxhash.xxh3_64((dst / name).read_bytes()).hexdigest() == digest, name
    manifest = json.loads((dst / "packer.json").read_text())
    assert manifest["kind"] == "image" and set(manifest["options"]) == CLASS_OPTIONS
    keys = (dst / "keys.txt").read_text().splitlines()
    sources = [next(tree.glob(key + ".*")).read_bytes() for key in keys]
    records = np.load(dst / "records.npy")
    index = np.load(dst / "index.npy")
    assert index["count"].tolist() == [1] * 12 and index["first"].tolist() == list(range(12))
    assert records["length"].tolist() == [len(s) for s in sources]
    assert records["checksum"].tolist() == [xxhash.xxh3_64_intdigest(s) for s in sources]
    shard = dst / _shard(suffix)
    data = shard.read_bytes()
    for offset, source in zip(records["offset"].tolist(), sources):
        assert data[offset : offset + len(source)] == source  # each record where its table says
    if suffix == ".npy":
        assert np.load(shard).tobytes() == b"".join(sources)  # back to back, nothing between
        assert (
            records["offset"].tolist() == (128 + np.cumsum([0, *map(len, sources[:-1])])).tolist()
        )
    elif suffix == ".lmdb":
        env = lmdb.open(str(shard), subdir=False, readonly=True, lock=False)
        with env.begin() as txn:
            stored = [(k, bytes(v)) for k, v in txn.cursor()]
        env.close()
        assert stored == [(i.to_bytes(8, "big"), s) for i, s in enumerate(sources)]


def _shard(suffix: str) -> str:
    return "shard-00000" + {".npy": ".npy", ".lmdb": ".mdb", ".h5": ".h5"}[suffix]
