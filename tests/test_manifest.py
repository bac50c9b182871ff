from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.core.handles import HandleCache
from packer.core.manifest import (
    INDEX_NAME,
    KEYS_NAME,
    MANIFEST_NAME,
    RECORDS_NAME,
    file_checksum,
    load_index,
    load_manifest,
    load_records,
)
from packer.core.manifest_schema import FORMAT_NAMES, TABLE_NAMES
from packer.core.sizes import format_size, parse_size
from packer.errors import FormatError, PackerError
from packer.formats import FORMATS


def copy_dataset(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_newer_layout_version_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy_dataset(packed[".npy"], tmp_path / "x.npy")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["layout_version"] = 99
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(FormatError, match="layout version 99; this packer reads up to version 2"):
        packer.open_dataset(root)


def test_older_layout_version_refused_with_the_command(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = copy_dataset(packed[".lmdb"], tmp_path / "x.lmdb")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["layout_version"] = 1
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(FormatError, match="older packer .layout version 1.") as caught:
        packer.open_dataset(root)
    assert f"packer convert {data['source']['root']} {root} --overwrite" in str(caught.value)


def test_unparsable_manifest_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy_dataset(packed[".npy"], tmp_path / "x.npy")
    (root / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(FormatError, match="not a valid packer manifest"):
        load_manifest(root)


def test_index_length_mismatch_refused(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy_dataset(packed[".lmdb"], tmp_path / "x.lmdb")
    manifest = load_manifest(root)
    index = load_index(root, manifest)
    np.save(root / INDEX_NAME, index[:-1])
    with pytest.raises(FormatError, match="differs from the checksum"):
        packer.open_dataset(root)
    data = json.loads((root / MANIFEST_NAME).read_text())  # crafted: checksum updated too
    data["files"][INDEX_NAME] = file_checksum(root / INDEX_NAME)
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(FormatError, match="rows but the manifest says"):
        packer.open_dataset(root)


def test_truncated_shard_refused_at_open(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy_dataset(packed[".h5"], tmp_path / "x.h5")
    shard = root / load_manifest(root).shards[0].name
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(FormatError, match="truncated or was modified"):
        packer.open_dataset(root)


def test_handle_cache_is_lru_and_drops_handles_when_pickled() -> None:
    closed = []

    class Handle:
        def __init__(self, name: str) -> None:
            self.name = name

        def close(self) -> None:
            closed.append(self.name)

    cache = HandleCache(capacity=2)
    for name in "abca":
        cache.get(name, lambda name=name: Handle(name))
    assert closed == ["a", "b"] and len(cache) == 2  # "a" was reopened, evicting "b"
    clone = pickle.loads(pickle.dumps(cache))
    assert len(clone) == 0 and clone.capacity == 2


@pytest.mark.parametrize(
    "text, value",
    [("16MB", 16_000_000), ("512MiB", 512 << 20), ("1GB", 10**9), ("1.5kB", 1500), ("42", 42)],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "MB", "-1MB", "0", "12 parsecs"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(PackerError, match="invalid size"):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(999) == "999 B" and format_size(1_234_567) == "1.2 MB"


def test_a_bad_field_is_named_with_the_value_found_and_expected(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = copy_dataset(packed[".h5"], tmp_path / "x.h5")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["shards"][1]["bytes"] = -1
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(FormatError) as caught:
        load_manifest(root)
    message = str(caught.value)
    assert str(root / MANIFEST_NAME) in message
    assert "shards[1].bytes is -1; expected an integer in 0..9223372036854775807" in message


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("classes", 5, "classes is 5; expected a list"),
        ("classes", ["a", "a", "b"], "expected a list without repeated names"),
        ("options", None, "options is None; expected an object"),
        ("num_samples", "12", "num_samples is '12'; expected an integer"),
        ("format", "zip", "format is 'zip'; expected one of 'bmp', 'hdf5', 'lmdb', 'npy'"),
        ("kind", "audio", "kind is 'audio'; expected one of 'image', 'video', 'splits'"),
        ("files", {"index.npy": "XYZ"}, "files.index.npy is 'XYZ'; expected 16 lowercase hex"),
        ("skipped", [{"path": "a"}], "skipped[0].reason is missing"),
        ("layout_version", True, "layout_version is True; expected an integer"),
    ],
)
def test_manifest_fields_are_type_checked(
    packed: dict[str, Path], tmp_path: Path, field: str, value: object, said: str
) -> None:
    root = copy_dataset(packed[".lmdb"], tmp_path / "x.lmdb")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data[field] = value
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(FormatError, match=re.escape(said)):
        packer.open_dataset(root)


def test_every_written_field_is_required(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy_dataset(packed[".npy"], tmp_path / "x.npy")
    data = json.loads((root / MANIFEST_NAME).read_text())
    assert "trusted_xxh3_64" in data  # the only optional one: a manifest written before it lacks it
    for name in [n for n in data if n != "trusted_xxh3_64"]:
        changed = {k: v for k, v in data.items() if k != name}
        (root / MANIFEST_NAME).write_text(json.dumps(changed))
        with pytest.raises(FormatError, match=f"{name} is missing"):
            load_manifest(root)


def test_unknown_fields_are_ignored(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy_dataset(packed[".npy"], tmp_path / "x.npy")
    before = load_manifest(root)
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["comment"] = "added by a later packer"
    data["shards"][0]["extra"] = 1
    data["options"]["future"] = [1, 2]
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    after = load_manifest(root)
    assert after.shards == before.shards and after.num_samples == before.num_samples
    assert after.options["future"] == [1, 2]  # options are kept whole: known ones checked
    assert [label for _, label in packer.open_dataset(root, output="bytes")] == [
        label for _, label in packer.open_dataset(packed[".npy"], output="bytes")
    ]


def test_schema_names_agree_with_the_registry_and_tables() -> None:
    assert set(FORMAT_NAMES) == {module.NAME for module in FORMATS.values()}
    assert TABLE_NAMES == (INDEX_NAME, RECORDS_NAME, KEYS_NAME)


def test_a_damaged_table_header_is_a_format_error(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy_dataset(packed[".npy"], tmp_path / "x.npy")
    data = bytearray((root / RECORDS_NAME).read_bytes())
    data[data.index(b"}")] ^= 0x01  # numpy's header parser raises tokenize.TokenError
    (root / RECORDS_NAME).write_bytes(bytes(data))
    with pytest.raises(FormatError, match=f"cannot read record table .*{RECORDS_NAME}"):
        load_records(root, load_index(root, load_manifest(root)))
