"""Tables attacked (issue 41): a deep JSONL line, a lone surrogate, a NUL in a path, a short or
long CSV row, an integer past int64 are that row's skip with its reason; a repeated CSV column
is refused; Parquet dates, timestamps and decimals are stored as ISO text and decimal strings;
"no usable row" says why; an unusable image file skips its whole row."""

from __future__ import annotations

import datetime
import decimal
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.demo.fields import make_caption_set
from packer.errors import SourceError


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    make_caption_set(tmp_path / "t", samples=3)
    return tmp_path / "t"


def _jsonl(folder: Path, rows: list[str]) -> Path:
    path = folder / "rows.jsonl"
    path.write_text("".join(r + "\n" for r in rows))
    return path


def _convert(table: Path, out: Path) -> packer.ConvertResult:
    return packer.convert(table, out, progress=False)


def test_a_deep_or_surrogate_jsonl_line_skips_that_row(folder: Path, tmp_path: Path) -> None:
    rows = [
        json.dumps({"image": "000000.jpg", "caption": "fine"}),
        '{"image": "000001.jpg", "extra": ' + "[" * 6000 + "]" * 6000 + "}",
        '{"image": "000002.jpg", "caption": "\\ud800"}',
    ]
    got = CliRunner().invoke(main, ["convert", str(_jsonl(folder, rows)), str(tmp_path / "o.lmdb")])
    assert got.exit_code == 0 and "internal error" not in got.output, got.output
    result = packer.open_dataset(tmp_path / "o.lmdb")
    assert len(result) == 1
    reasons = sorted(s["reason"] for s in result.manifest.skipped)
    assert "too deep" in reasons[0] + reasons[1] and "surrogate" in reasons[0] + reasons[1]


def test_a_nul_or_surrogate_in_an_image_path_skips_that_row(folder: Path, tmp_path: Path) -> None:
    (folder / "rows.csv").write_text("image,caption\n000000.jpg,a\n000001\x00.jpg,b\n")
    rows = [json.dumps({"image": "000000.jpg"}), '{"image": "\\udcff.jpg"}']
    for table in (folder / "rows.csv", _jsonl(folder, rows)):
        result = _convert(table, tmp_path / f"{table.suffix}.lmdb")
        assert result.manifest.num_samples == 1
        assert ["NUL" in s.reason or "surrogate" in s.reason for s in result.skipped] == [True]


def test_a_short_or_long_csv_row_is_skipped_never_null(folder: Path, tmp_path: Path) -> None:
    text = "image,caption,label\n000000.jpg,a,1\n000001.jpg,b\n000002.jpg,c,2,extra\n"
    (folder / "rows.csv").write_text(text)
    result = _convert(folder / "rows.csv", tmp_path / "o.lmdb")
    assert result.manifest.num_samples == 1
    assert sorted(s.reason for s in result.skipped) == [
        "2 cells, the header names 3 columns",
        "4 cells, the header names 3 columns",
    ]


def test_a_repeated_csv_column_is_refused(folder: Path, tmp_path: Path) -> None:
    (folder / "rows.csv").write_text("image,caption,caption\n000000.jpg,a,b\n")
    with pytest.raises(SourceError, match="'caption' is named twice"):
        _convert(folder / "rows.csv", tmp_path / "o.lmdb")


def test_an_integer_past_int64_is_skipped_at_conversion(folder: Path, tmp_path: Path) -> None:
    rows = [
        json.dumps({"image": f"00000{i}.jpg", "label": v})
        for i, v in enumerate([1, 2**63, -(2**63)])
    ]
    result = _convert(_jsonl(folder, rows), tmp_path / "o.lmdb")
    assert [s.reason for s in result.skipped] == [
        f"field 'label': an integer outside int64 (b'{2**63}')"
    ]
    ds = packer.open_dataset(result.dst, fields=("label",))
    batch = packer.collate_fields([ds[i] for i in range(len(ds))])  # raised before
    assert sorted(batch[0].tolist()) == [-(2**63), 1]


def test_parquet_temporal_and_decimal_columns_are_stored_as_text(
    folder: Path, tmp_path: Path
) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    when = datetime.datetime(2024, 5, 6, 7, 8, 9)
    table = pa.table(
        {
            "image": ["000000.jpg", "000001.jpg"],
            "taken": pa.array([when, None], pa.timestamp("us")),
            "day": pa.array([datetime.date(2024, 5, 6), datetime.date(1999, 1, 2)], pa.date32()),
            "price": pa.array(
                [decimal.Decimal("1.50"), decimal.Decimal("-2")], pa.decimal128(5, 2)
            ),
            "days": pa.array([[datetime.date(2024, 1, 1)], []], pa.list_(pa.date32())),
        }
    )
    pq.write_table(table, folder / "rows.parquet")
    result = _convert(folder / "rows.parquet", tmp_path / "o.lmdb")
    assert not result.skipped
    ds = packer.open_dataset(result.dst, fields=("taken", "day", "price", "days"))
    assert ds[0] == ("2024-05-06T07:08:09", "2024-05-06", "1.50", ["2024-01-01"])
    assert ds[1] == (None, "1999-01-02", "-2.00", [])
    kinds = {f["name"]: f["kind"] for f in ds.manifest.options["fields"]}
    assert [kinds[n] for n in ("taken", "day", "price", "days")] == ["text", "text", "text", "json"]


def test_no_usable_row_gives_the_reasons(folder: Path, tmp_path: Path) -> None:
    (folder / "rows.csv").write_text("image,caption\nnone1.jpg,a\nnone2.jpg,b\n/abs.jpg,c\n")
    with pytest.raises(SourceError) as caught:
        _convert(folder / "rows.csv", tmp_path / "o.lmdb")
    said = str(caught.value)
    assert "3 skipped" in said and "2 × image 'none1.jpg': No such file" in said, said
    assert "outside the table's folder" in said


def test_a_row_whose_image_is_a_fifo_is_skipped_whole(folder: Path, tmp_path: Path) -> None:
    os.mkfifo(folder / "fifo.jpg")
    (folder / "rows.csv").write_text("image,caption\n000000.jpg,a\nfifo.jpg,b\n")
    result = _convert(folder / "rows.csv", tmp_path / "o.lmdb")
    assert result.manifest.num_samples == 1
    assert [s.reason for s in result.skipped] == ["image 'fifo.jpg' is not a file"]
