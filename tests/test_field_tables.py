"""A table of samples as a source (issue 30): CSV, TSV, JSONL and Parquet tables of captions
convert to LMDB, NPY and HDF5 and read back field for field equal to their rows through
DataLoader workers; bad rows skipped with their reason, bad tables refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader

import packer
from packer.cli import main
from packer.demo.fields import make_caption_set, write_table

Samples = dict[str, dict[str, bytes]]


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Samples:
    return make_caption_set(tmp_path_factory.mktemp("files"), samples=14)


def _expected(fields: dict[str, bytes], with_json: bool) -> dict[str, object]:
    want: dict[str, object] = {
        "image": fields["jpg"],
        "caption": fields["txt"].decode(),
        "label": int(fields["cls"]),
    }
    if with_json:
        want["json"] = json.loads(fields["json"]) if "json" in fields else None
    return want


@pytest.mark.parametrize(
    "table, out",
    [
        *(("t.csv", suffix) for suffix in (".lmdb", ".npy", ".h5")),
        *(("t.tsv", ".npy"), ("t.jsonl", ".h5"), ("t.parquet", ".lmdb")),
    ],
)
def test_table_reads_back_row_for_row_through_workers(
    table: str, out: str, written: Samples, tmp_path: Path
) -> None:
    path = write_table(written, tmp_path / "src" / table)
    result = packer.convert(path, tmp_path / f"o{out}", progress=False)
    assert result.manifest.options["source_kind"] == "table" and not result.skipped
    with_json = not table.endswith("sv")
    ds = packer.FieldDataset(result.dst, output="bytes")
    loader = DataLoader(
        packer.open_dataset(result.dst, fields=("caption", "label", "json")) if with_json else ds,
        batch_size=4,
        num_workers=2,
        collate_fn=packer.collate_fields,
        # forkserver: pickled into a fresh process, as under spawn (spawn for field batches:
        # tests/test_field_transport.py), torch not imported again
        multiprocessing_context="forkserver" if table.endswith(".parquet") else "fork",
    )
    seen = 0
    for batch in loader:
        for i in range(len(batch[0] if with_json else batch["__key__"])):
            key = ds.keys[seen]
            want = _expected(written[key], with_json)
            if with_json:
                caption, label, meta = batch[0][i], int(batch[1][i]), batch[2][i]
                assert (caption, label, meta) == (want["caption"], want["label"], want["json"])
            else:
                assert batch["caption"][i].decode() == want["caption"]
            assert ds[seen]["image"] == want["image"]  # the image bytes unchanged
            seen += 1
    assert seen == len(written)


def test_bad_rows_skipped_with_their_reason(written: Samples, tmp_path: Path) -> None:
    path = write_table(written, tmp_path / "t.csv")
    lines = path.read_text(encoding="utf-8").splitlines()
    lines += [
        "k1,,no image,1",
        "k2,/etc/passwd,absolute,1",
        "k3,../outside.jpg,climbs,1",
        "k4,images/missing.jpg,missing,1",
        f"k5,{lines[1].split(',')[1]},not an int,three",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = packer.convert(path, tmp_path / "o.lmdb", progress=False)
    reasons = sorted(s.reason for s in result.skipped)
    assert f"{path}:{len(lines)}" in [s.path for s in result.skipped]  # the row's line
    assert "field 'label': not an integer: 'three'" in reasons
    assert any("no image path" in r for r in reasons)
    assert sum("outside the table's folder" in r for r in reasons) == 2
    assert any("missing.jpg" in r and "No such file" in r for r in reasons)
    assert len(result.skipped) == 5 and result.manifest.num_samples == len(written)


def test_jsonl_line_that_does_not_parse_is_skipped(written: Samples, tmp_path: Path) -> None:
    path = write_table(written, tmp_path / "t.jsonl")
    with open(path, "a", encoding="utf-8") as handle:
        handle.write('{"image": "images/000000.jpg", "caption": \n')
        handle.write('["a list"]\n')
    result = packer.convert(path, tmp_path / "o.npy", progress=False)
    reasons = [s.reason for s in result.skipped]
    assert len(reasons) == 2 and reasons[0].startswith("not a JSON line")
    assert reasons[1] == "not a JSON object"


def test_caption_not_utf8_skips_its_row(written: Samples, tmp_path: Path) -> None:
    path = write_table(written, tmp_path / "t.jsonl")
    with open(path, "ab") as handle:
        handle.write(b'{"image": "images/000000.jpg", "caption": "caf\xe9"}\n')
    result = packer.convert(path, tmp_path / "o.npy", progress=False)
    assert len(result.skipped) == 1 and "not a JSON line" in result.skipped[0].reason
    csv_path = write_table(written, tmp_path / "c" / "t.csv")
    with open(csv_path, "ab") as handle:
        handle.write(b"x,images/000000.jpg,caf\xe9,1\n")
    got = CliRunner().invoke(main, ["convert", str(csv_path), str(tmp_path / "c.lmdb"), "-q"])
    assert got.exit_code != 0 and "cannot be read as CSV" in got.output
    assert "Traceback" not in got.output


def test_bad_tables_refused_in_one_line(written: Samples, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"image": [1, 2], "caption": ["a", "b"]}), wrong)
    spaced = tmp_path / "spaced.csv"
    spaced.write_text("image,Caption Text\nimages/a.jpg,hi\n")
    noimage = tmp_path / "noimage.csv"
    noimage.write_text("url,caption\nhttp://x/a.jpg,hi\n")
    cases = [
        ([str(wrong)], "image column 'image' holds int64, not paths"),
        ([str(spaced)], "field name 'Caption Text'"),
        ([str(noimage)], "has no image column"),
        ([str(noimage), "--image-column", "picture"], "has no column 'picture'"),
    ]
    for args, message in cases:
        got = CliRunner().invoke(main, ["convert", *args, str(tmp_path / "o.lmdb"), "-q"])
        assert got.exit_code != 0 and message in got.output, got.output
        assert "Traceback" not in got.output


def test_image_column_and_require_from_the_cli(written: Samples, tmp_path: Path) -> None:
    path = write_table(written, tmp_path / "t.jsonl")
    text = path.read_text(encoding="utf-8").replace('"image":', '"picture":')
    path.write_text(text, encoding="utf-8")
    dst = tmp_path / "o.lmdb"
    args = ["convert", str(path), str(dst), "--image-column", "picture", "--require", "json"]
    got = CliRunner().invoke(main, [*args, "-q"])
    assert got.exit_code == 0, got.output
    ds = packer.open_dataset(dst, fields=("picture", "json"), output="bytes")
    assert len(ds) == 7 and ds[0][0] == written["000000"]["jpg"]
