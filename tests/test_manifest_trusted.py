"""Issue 41 item 5 (W10, W11): the parts of packer.json a reader trusts carry a checksum that
open_dataset and verify check, and every sample with fields has one record per field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.core.manifest import MANIFEST_NAME
from packer.core.manifest_schema import trusted_digest


@pytest.fixture
def fields_ds(tmp_path: Path) -> Path:
    out = tmp_path / "f.lmdb"
    packer.pack(range(6), out, lambda i: {"txt": f"dog {i}", "cls": i}, workers=1, progress=False)
    return out


def _edit(root: Path, change: Any, resign: bool = False) -> None:
    path = root / MANIFEST_NAME
    data = json.loads(path.read_text())
    change(data)
    if resign:
        data["trusted_xxh3_64"] = trusted_digest(data)
    path.write_text(json.dumps(data, indent=1))


def _refused_by_verify(root: Path, reason: str) -> None:
    done = CliRunner().invoke(main, ["verify", str(root)])
    assert done.exit_code == 1 and reason in done.output, done.output


def _flip(text: str, old: str, new: str) -> str:
    assert text.count(old) >= 1
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"name": "txt"', '"name": "tyt"'),
        ('"kind": "text"', '"kind": "json"'),
        ('"num_samples": 6', '"num_samples": 5'),
    ],
)
def test_a_flipped_byte_in_what_a_reader_trusts_is_refused(
    fields_ds: Path, old: str, new: str
) -> None:
    path = fields_ds / MANIFEST_NAME
    path.write_text(_flip(path.read_text(), old, new))
    with pytest.raises(packer.FormatError, match="damaged or was edited"):
        packer.open_dataset(fields_ds)
    _refused_by_verify(fields_ds, "damaged or was edited")


def test_a_flipped_class_name_is_refused(tmp_path: Path) -> None:
    from packer.demo.image import make_image_tree

    tree = make_image_tree(tmp_path / "img", classes=2, per_class=2, size=(16, 16), bad=0)
    out = tmp_path / "c.npy"
    packer.convert(tree.root, out, workers=1, progress=False)
    classes = packer.open_dataset(out).classes
    path = out / MANIFEST_NAME
    path.write_text(_flip(path.read_text(), f'"{classes[0]}"', f'"{classes[0][:-1]}X"'))
    with pytest.raises(packer.FormatError, match="damaged or was edited"):
        packer.open_dataset(out)


def test_an_edited_fields_list_signed_again_is_refused_by_the_record_count(fields_ds: Path) -> None:
    """W10: one field added (or removed) and the checksum re-signed: each sample's records no
    longer match the fields, which the open refuses instead of serving shifted records."""
    _edit(
        fields_ds,
        lambda d: d["options"]["fields"].append({"name": "jpg", "kind": "image"}),
        resign=True,
    )
    with pytest.raises(packer.FormatError, match="other than 3 records, one per field"):
        packer.open_dataset(fields_ds)


def test_a_removed_field_is_refused_too(fields_ds: Path) -> None:
    _edit(fields_ds, lambda d: d["options"]["fields"].pop(), resign=True)
    with pytest.raises(packer.FormatError, match="other than 1 records, one per field"):
        packer.open_dataset(fields_ds)
    _refused_by_verify(fields_ds, "one per field")


def test_what_a_reader_does_not_trust_may_change_and_a_manifest_without_a_checksum_opens(
    fields_ds: Path,
) -> None:
    _edit(fields_ds, lambda d: d.update(created="1999-01-01T00:00:00+0000"))
    assert len(packer.open_dataset(fields_ds)) == 6
    _edit(fields_ds, lambda d: d.pop("trusted_xxh3_64"))  # written before the checksum existed
    assert packer.open_dataset(fields_ds)[0]["txt"] == "dog 0"
