from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.core.manifest import load_index, load_keys, load_manifest, load_records
from packer.read.verify import verify


def test_intact_dataset_verifies(packed: dict[str, Path], suffix: str) -> None:
    report = verify(packed[suffix], full=True, progress=False)
    assert report.ok, report.summary()
    assert report.samples_checked == report.decoded == len(packer.open_dataset(packed[suffix]))


def test_flipped_byte_names_the_sample(packed: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(packed[".npy"], tmp_path / "x.npy"))
    manifest = load_manifest(root)
    records = load_records(root, load_index(root, manifest))
    target = 5  # an image is one record: record 5 is sample 5
    shard = root / manifest.shards[records["file"][target]].name
    raw = bytearray(shard.read_bytes())
    raw[int(records["offset"][target]) + 100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    report = verify(root, progress=False)
    assert not report.ok
    text = report.summary()
    assert f"{shard.name}: checksum differs" in text
    assert f"sample {load_keys(root)[target]!r}: stored bytes differ" in text
    result = CliRunner().invoke(main, ["verify", str(root), "-q"])
    assert result.exit_code == 1 and "problem(s)" in result.output


def test_missing_bmp_file_reported(packed: dict[str, Path], tmp_path: Path) -> None:
    root = Path(shutil.copytree(packed[".bmp"], tmp_path / "x.bmp"))
    key = load_keys(root)[0]
    (root / f"{key}.bmp").unlink()
    report = verify(root, progress=False)
    assert [p.where for p in report.problems] == [f"file sample {key!r}"]
    result = CliRunner().invoke(main, ["verify", str(packed[".bmp"]), "-q", "--full"])
    assert result.exit_code == 0 and ": OK" in result.output
