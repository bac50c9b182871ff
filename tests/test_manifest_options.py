"""The manifest's options are typed (``Manifest.opts``, core/manifest_options): a wrong type or value
is refused by name as the manifest is loaded, an option this packer does not know round-trips,
and every option packer reads or writes is declared."""

from __future__ import annotations

import json
import pickle
import re
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.core.manifest import MANIFEST_NAME, load_manifest, write_manifest
from packer.core.manifest_options import DECLARED, FieldSpec, ManifestOptions, parse_options
from packer.core.manifest_schema import trusted_digest
from packer.errors import FormatError

PACKAGE = Path(packer.__file__).parent


def _edited(src: Path, dst: Path, **changes: Any) -> Path:
    """A copy of the output ``src`` whose manifest's options have ``changes`` (a value None: the
    option removed), its trusted checksum written again: only the options' check can refuse it."""
    root = Path(shutil.copytree(src, dst))
    data = json.loads((root / MANIFEST_NAME).read_text())
    for name, value in changes.items():
        if value is None:
            data["options"].pop(name, None)
        else:
            data["options"][name] = value
    data["trusted_xxh3_64"] = trusted_digest(data)
    (root / MANIFEST_NAME).write_text(json.dumps(data, indent=1))
    return root


WRONG = [
    ("layout", 7, "options.layout is 7; expected a string"),
    ("layout", "tiles", "options.layout is 'tiles'; expected one of 'shards', 'per-sample'"),
    ("pixels", "x", "options.pixels is 'x'; expected a list of 3 items"),
    ("pixels", [8, 0, 3], r"options.pixels\[1\] is 0; expected an integer in 1\.\."),
    ("fields", "jpg", "options.fields is 'jpg'; expected a list"),
    ("fields", [{"name": "JPG", "kind": "image"}], r"options.fields\[0\].name is 'JPG'"),
    ("splits", ["train"], r"options.splits is \['train'\]; expected an object"),
    ("categories", [{"id": "1", "name": "dog"}], r"options.categories\[0\].id is '1'"),
    ("storage", {"data_bytes": -1}, "options.storage.data_bytes is -1; expected a finite"),
    ("resize", {"quality": 90}, "options.resize.max_side is missing"),
    ("part", [0], r"options.part is \[0\]; expected a list of 2 items"),
    ("follow_links", "yes", "options.follow_links is 'yes'; expected true or false"),
    ("class_index", {"train": 3}, "options.class_index.train is 3; expected a string"),
    ("layout", None, "options.layout is missing"),
]


@pytest.mark.parametrize(("option", "value", "message"), WRONG)
def test_a_wrong_option_is_refused_by_name_through_open_dataset(
    packed: dict[str, Path], tmp_path: Path, option: str, value: Any, message: str
) -> None:
    root = _edited(packed[".npy"], tmp_path / "x.npy", **{option: value})
    with pytest.raises(FormatError, match=message) as caught:
        packer.open_dataset(root)
    assert repr(str(root / MANIFEST_NAME)) in str(caught.value)  # the file is named too


@pytest.mark.parametrize(("option", "value", "message"), WRONG[:6])
def test_a_wrong_option_is_refused_by_name_through_packer_verify(
    packed: dict[str, Path], tmp_path: Path, option: str, value: Any, message: str
) -> None:
    root = _edited(packed[".lmdb"], tmp_path / "x.lmdb", **{option: value})
    result = CliRunner().invoke(main, ["verify", str(root), "-q"])
    assert result.exit_code != 0
    assert re.search(message, result.output), result.output
    assert str(root / MANIFEST_NAME) in result.output


def _fields_output(root: Path) -> Path:
    with packer.Writer(root, shard_size=20_000) as writer:
        for i in range(3):
            writer.write({"__key__": f"s{i}", "txt": f"caption {i}", "cls": i})
    return root


def test_what_a_kind_needs_is_checked_with_the_options(tmp_path: Path) -> None:
    out = _fields_output(tmp_path / "f.npy")
    assert packer.open_dataset(out).manifest.opts.fields == (
        FieldSpec("cls", "int"),
        FieldSpec("txt", "text"),
    )
    empty = _edited(out, tmp_path / "empty.npy", fields=[])
    with pytest.raises(FormatError, match=r"options.fields is \[\]; expected one or more fields"):
        packer.open_dataset(empty)
    twice = [{"name": "txt", "kind": "text"}] * 2
    repeated = _edited(out, tmp_path / "twice.npy", fields=twice)
    with pytest.raises(FormatError, match="options.fields is .'txt', 'txt'.; expected"):
        packer.open_dataset(repeated)


def test_an_unknown_option_loads_and_round_trips(packed: dict[str, Path], tmp_path: Path) -> None:
    later = {"how": ["a", 1], "nested": {"x": None}}
    root = _edited(packed[".npy"], tmp_path / "x.npy", zz_from_a_later_packer=later)
    manifest = packer.open_dataset(root).manifest
    assert manifest.opts.unknown == {"zz_from_a_later_packer": later}
    assert manifest.to_dict()["options"]["zz_from_a_later_packer"] == later
    before = json.loads((root / MANIFEST_NAME).read_text())["options"]
    write_manifest(root, load_manifest(root))
    after = json.loads((root / MANIFEST_NAME).read_text())["options"]
    assert list(after.items()) == list(before.items())  # the same options, in the same order


def test_packer_json_bytes_are_what_the_loaded_manifest_writes(packed: dict[str, Path]) -> None:
    for root in packed.values():
        raw = (root / MANIFEST_NAME).read_bytes()
        data = load_manifest(root).to_dict()
        data["trusted_xxh3_64"] = trusted_digest(data)
        assert json.dumps(data, indent=1).encode("ascii") == raw, root


def test_the_defaults_are_the_declared_ones(packed: dict[str, Path], tmp_path: Path) -> None:
    root = _edited(packed[".npy"], tmp_path / "x.npy", pixels=None, storage=None)
    opts = load_manifest(root).opts
    assert (opts.pixels, dict(opts.storage), opts.fields, opts.splits) == (None, {}, (), {})
    assert parse_options({"splits": {"train": 3}}, "splits").layout == "shards"
    with pytest.raises(FormatError, match="options.splits is missing"):
        parse_options({}, "splits")


def test_every_option_written_by_a_conversion_is_declared(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    outputs = [*packed.values(), _fields_output(tmp_path / "f.lmdb")]
    for root in outputs:
        manifest = load_manifest(root)
        assert manifest.opts.unknown == {}, (root, sorted(manifest.opts.unknown))
        assert set(manifest.options) <= set(DECLARED)


def _sources() -> dict[Path, str]:
    return {p: p.read_text() for p in PACKAGE.rglob("*.py")}


def test_every_option_read_in_packer_is_declared() -> None:
    read = {
        (p.relative_to(PACKAGE).as_posix(), name)
        for p, text in _sources().items()
        for name in re.findall(r"\.opts\.([a-z_]+)", text)
    }
    assert len(read) >= 20  # the readers of read/, remote/, formats/, write/, upload/, diagnosis/
    undeclared = {r for r in read if r[1] not in DECLARED and r[1] != "field_names"}
    assert undeclared == set()
    assert {f.name for f in fields(ManifestOptions)} == {*DECLARED, "unknown"}


def test_the_options_as_found_are_read_only_where_they_are_wanted_whole() -> None:
    """No option is read out of the raw dict (``.options.get("layout", "shards")``): two places
    take the options whole (the resume check compares them with the fingerprint; inspect --json
    shows them as found)."""
    raw = sorted(
        (p.relative_to(PACKAGE).as_posix(), line.strip())
        for p, text in _sources().items()
        for line in text.splitlines()
        if re.search(r"(manifest|\bm|top)\.options\b", line)
    )
    assert raw == [
        ("read/describe.py", '"options": m.options,'),
        (
            "write/finish.py",
            'options = {k: v for k, v in manifest.options.items() if k != "storage"}',
        ),
    ]


def test_a_pickled_manifest_carries_its_options_once(packed: dict[str, Path]) -> None:
    """The typed options are not pickled beside the options as found (a dataset at a URL pickles
    its manifest): the clone parses them again when it reads them, to the same values."""
    manifest = load_manifest(packed[".npy"])
    assert manifest.opts.layout == "shards"
    data = pickle.dumps(manifest, protocol=5)
    assert b"ManifestOptions" not in data
    clone = pickle.loads(data)
    assert "opts" not in vars(clone) and clone == manifest
    assert clone.opts == manifest.opts
