"""Issue 40 item 4 and its surviving mutants: crafted tables and manifests re-signed so every
checksum agrees are still refused at open with a FormatError naming the file; an absent field
holding bytes, a version-3 manifest and URL names that decode to '..' are refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import packer
from packer.core.contained import check_url_name
from packer.core.fields import ABSENT, record_matches
from packer.core.manifest import (
    INDEX_NAME,
    MANIFEST_NAME,
    RECORDS_NAME,
    file_checksum,
    load_index,
    load_manifest,
)
from packer.demo.fields import make_caption_set
from packer.errors import FormatError


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _resign(root: Path, name: str) -> None:
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["files"][name] = file_checksum(root / name)
    (root / MANIFEST_NAME).write_text(json.dumps(data))


def test_a_sample_of_zero_records_is_refused_at_open(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(packed[".npy"], tmp_path / "x.npy")
    index = load_index(root, load_manifest(root)).copy()
    # sample 0 holds no record, sample 1 takes sample 0's: the runs still tile the records
    index["count"][1] += index["count"][0]
    index["first"][1] = index["first"][0]
    index["count"][0] = 0
    np.save(root / INDEX_NAME, index)
    _resign(root, INDEX_NAME)
    with pytest.raises(FormatError, match=f"{RECORDS_NAME}.*does not match the samples"):
        packer.open_dataset(root)


def test_a_header_declaring_more_rows_than_the_file_holds_is_a_format_error(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(packed[".npy"], tmp_path / "x.npy")
    raw = bytearray((root / RECORDS_NAME).read_bytes())
    end = raw.index(b"\n")
    header = raw[:end].decode("latin1")
    rows = int(header.split("'shape': (")[1].split(",")[0])
    longer = header.replace(f"({rows},)", f"({rows * 100},)")
    longer = longer[: len(header)] if len(longer) > len(header) else longer.ljust(len(header))
    assert f"({rows * 100},)" in longer
    raw[:end] = longer.encode("latin1")
    (root / RECORDS_NAME).write_bytes(bytes(raw))
    _resign(root, RECORDS_NAME)
    with pytest.raises(FormatError, match=f"{RECORDS_NAME}.* is truncated"):
        packer.open_dataset(root)


def test_a_version_3_manifest_is_refused_not_read_as_2(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = _copy(packed[".lmdb"], tmp_path / "x.lmdb")
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["layout_version"] = 3
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(FormatError, match="layout version 3; this packer reads up to version 2"):
        packer.open_dataset(root)


def test_an_absent_field_record_that_holds_bytes_fails_verify(tmp_path: Path) -> None:
    assert record_matches(b"", ABSENT) and not record_matches(b"x", ABSENT)
    make_caption_set(tmp_path / "src", samples=6)
    root = packer.convert(tmp_path / "src", tmp_path / "c.npy", progress=False).dst
    manifest = load_manifest(root)
    records = np.load(root / RECORDS_NAME).copy()
    present = int(np.flatnonzero(records["length"] > 0)[0])
    records["checksum"][present] = ABSENT  # claims "absent" yet its record holds bytes
    np.save(root / RECORDS_NAME, records)
    _resign(root, RECORDS_NAME)
    assert manifest.kind == "fields"
    report = packer.verify(root, full=True, progress=False)
    assert not report.ok
    assert any("differ from their checksum" in p.what for p in report.problems), report


@pytest.mark.parametrize(
    "name",
    ["..\\secret", "a\\..\\..\\secret", "%252e%252e/secret", "%25252e%25252e/x", "a/%252e%252e"],
)
def test_a_url_name_that_decodes_to_dotdot_is_refused(name: str) -> None:
    with pytest.raises(FormatError, match="not a plain relative name"):
        check_url_name(name, "https://example.invalid/data.npy")


def test_a_plain_url_name_passes() -> None:
    assert check_url_name("shard-00000.npy", "https://example.invalid/d") == "shard-00000.npy"
