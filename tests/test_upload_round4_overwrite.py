"""Issue 40 item 3: ``--overwrite`` replaces the old dataset, nothing else. An old manifest is
the top ``packer.json`` and the manifests of the splits it names; a user's nested copy of a
dataset (``mycopy-v1.npy/``, a complete packer dataset of its own) and a ``train/packer.json``
the top manifest does not name are kept, with every object they list. The splits a top
manifest names are still replaced whole. Against a real S3 server (moto on the loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest
from s3_server import S3Server
from test_remote_write import assert_same_dataset, files, objects

import packer
from packer.demo.image import make_image_tree
from packer.upload.staging import convert_to_url

BUCKET = "round4-overwrite"
SHARD = "4kB"


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("overwrite_src")
    first = make_image_tree(root / "first", classes=2, per_class=6, size=(64, 48), bad=0)
    second = make_image_tree(root / "second", classes=3, per_class=2, size=(48, 32), bad=0)
    for split, count in (("train", 4), ("val", 2)):
        make_image_tree(root / "splits" / split, classes=2, per_class=count, size=(40, 30), bad=0)
    return {"first": first.root, "second": second.root, "splits": root / "splits"}


def _common(server: S3Server) -> dict:
    options = {"endpoint_url": server.endpoint}
    return dict(storage_options=options, shard_size=SHARD, workers=1, progress=False)


def test_a_nested_dataset_and_an_unnamed_split_manifest_survive_overwrite(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    url, common = f"s3://{BUCKET}/nested.npy", _common(server)
    convert_to_url(sources["first"], url, staging=tmp_path / "one", **common)
    copy = tmp_path / "mycopy-v1.npy"  # a user's copy of a dataset, uploaded inside the prefix
    packer.convert(sources["second"], copy, shard_size=SHARD, workers=1, progress=False)
    fs = server.filesystem()
    theirs = {f"mycopy-v1.npy/{name}": data for name, data in files(copy).items()}
    theirs["train/packer.json"] = b'{"a note": "not a split of this dataset"}\n'
    for name, data in theirs.items():
        fs.pipe_file(f"{url}/{name}", data)
    assert len(theirs) >= 6
    convert_to_url(sources["second"], url, overwrite=True, staging=tmp_path / "two", **common)
    found = objects(server, url)
    for name, data in theirs.items():
        assert found.pop(name) == data, name
    local = tmp_path / "second.npy"
    packer.convert(sources["second"], local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(found, files(local))  # the first dataset's objects all replaced
    nested = packer.open_dataset(f"{url}/mycopy-v1.npy", storage_options=common["storage_options"])
    assert len(nested) == 6


def test_the_splits_the_top_manifest_names_are_replaced_whole(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    url, common = f"s3://{BUCKET}/splits.lmdb", _common(server)
    convert_to_url(sources["splits"], url, staging=tmp_path / "one", **common)
    assert "train/packer.json" in objects(server, url)
    convert_to_url(sources["second"], url, overwrite=True, staging=tmp_path / "two", **common)
    local = tmp_path / "second.lmdb"
    packer.convert(sources["second"], local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))  # no train/ or val/ object left
