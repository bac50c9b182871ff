"""Hugging Face sources (issue 45 item 1): Parquet files, ``save_to_disk`` folders and
``DatasetDict`` folders written by the real ``datasets`` library convert without it; an image and
ClassLabel table reads as ``(image, label)`` with the ClassLabel's classes and labels, byte for
byte the bytes ``datasets`` holds; a richer table reads as fields; bad rows are skipped and
listed; a truncated file is refused in one line; memory is a row group, not the file."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image

import packer
from packer.cli import main

datasets = pytest.importorskip("datasets")  # the dev extra installs it: CI runs these
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

NAMES = ["zebra", "ant", "cat"]  # not sorted: the feature's order is the class index


def _jpeg(seed: int, side: int = 16) -> bytes:
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


def _images(n: int = 9, side: int = 16) -> datasets.Dataset:
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=NAMES)}
    )
    rows = {
        "image": [{"bytes": _jpeg(i, side), "path": f"img{i}.jpg"} for i in range(n)],
        "label": [(i * 2) % 3 for i in range(n)],
    }
    return datasets.Dataset.from_dict(rows, features=features)


def _hf_bytes(ds: datasets.Dataset) -> list[bytes]:
    raw = ds.cast_column("image", datasets.Image(decode=False))
    return [row["image"]["bytes"] for row in raw]


def _run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def _check_images(out: Path, hf: datasets.Dataset, split: str | None = None) -> None:
    ds = packer.open_dataset(out, output="bytes", split=split)
    assert ds.classes == hf.features["label"].names == NAMES
    got = [ds[i] for i in range(len(ds))]
    assert [label for _, label in got] == hf["label"]
    assert [bytes(image) for image, _ in got] == _hf_bytes(hf)


def test_parquet_of_images_converts_through_the_cli(tmp_path: Path) -> None:
    hf = _images()
    hf.to_parquet(tmp_path / "train-00000-of-00001.parquet")
    code, out = _run("convert", tmp_path / "train-00000-of-00001.parquet", tmp_path / "o.lmdb")
    assert code == 0, out
    assert "Hugging Face datasets: a Parquet file of datasets" in out
    manifest = json.loads((tmp_path / "o.lmdb" / "packer.json").read_text())
    assert manifest["kind"] == "image" and manifest["options"]["source_kind"] == "hf"
    _check_images(tmp_path / "o.lmdb", hf)
    ds = packer.open_dataset(tmp_path / "o.lmdb")  # decoded as a class tree's images are
    image, label = ds[4]
    assert image.size == (16, 16) and label == hf[4]["label"]


def test_save_to_disk_folder_converts_through_the_api(tmp_path: Path) -> None:
    hf = _images(7)
    hf.save_to_disk(tmp_path / "saved")
    result = packer.convert(tmp_path / "saved", tmp_path / "o.h5", progress=False)
    assert not result.skipped and result.manifest.kind == "image"
    _check_images(tmp_path / "o.h5", hf)


def test_dataset_dict_converts_into_splits_with_one_class_index(tmp_path: Path) -> None:
    train, test = _images(8), _images(5).select([4, 0, 2])
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(tmp_path / "dd")
    code, out = _run("convert", tmp_path / "dd", tmp_path / "o.lmdb")
    assert code == 0, out
    top = json.loads((tmp_path / "o.lmdb" / "packer.json").read_text())
    assert top["kind"] == "splits" and top["classes"] == NAMES
    assert top["options"]["splits"] == {"train": 8, "test": 3}
    _check_images(tmp_path / "o.lmdb", train, split="train")
    _check_images(tmp_path / "o.lmdb", test, split="test")


def test_parquet_folder_named_by_split_converts_into_splits(tmp_path: Path) -> None:
    train, val = _images(6), _images(4)
    train.to_parquet(tmp_path / "data" / "train-00000-of-00001.parquet")
    val.to_parquet(tmp_path / "data" / "validation-00000-of-00001.parquet")
    result = packer.convert(tmp_path / "data", tmp_path / "o.lmdb", progress=False)
    assert result.manifest.options["splits"] == {"train": 6, "validation": 4}
    _check_images(tmp_path / "o.lmdb", val, split="validation")


def test_splits_with_other_classlabel_names_are_refused(tmp_path: Path) -> None:
    other = _images(3).cast_column("label", datasets.ClassLabel(names=["a", "b", "c"]))
    datasets.DatasetDict({"train": _images(3), "test": other}).save_to_disk(tmp_path / "dd")
    with pytest.raises(packer.PackerError, match="split 'test'.*labels would disagree"):
        packer.convert(tmp_path / "dd", tmp_path / "o.lmdb", progress=False)


def _rich() -> datasets.Dataset:
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "label": datasets.ClassLabel(names=NAMES),
            "caption": datasets.Value("string"),
            "score": datasets.Value("float32"),
            "count": datasets.Value("int64"),
            "tags": datasets.Sequence(datasets.Value("string")),
            "box": {"x": datasets.Value("int32"), "name": datasets.Value("string")},
        }
    )
    rows = {
        "image": [{"bytes": _jpeg(i), "path": None} for i in range(4)],
        "label": [2, 0, 1, 2],
        "caption": ["a cat", None, "zëbra", ""],
        "score": [0.5, 1.25, -2.0, 3.0],
        "count": [1, 2, 3, 2**40],
        "tags": [["x"], [], ["y", "z"], ["w"]],
        "box": [{"x": 1, "name": "q"}, {"x": 2, "name": None}, {"x": 3, "name": "r"}, None],
    }
    return datasets.Dataset.from_dict(rows, features=features)


def test_a_richer_table_reads_as_fields_equal_to_datasets(tmp_path: Path) -> None:
    hf = _rich()
    hf.to_parquet(tmp_path / "rich.parquet")
    result = packer.convert(tmp_path / "rich.parquet", tmp_path / "o.lmdb", progress=False)
    kinds = {f["name"]: f["kind"] for f in result.manifest.options["fields"]}
    assert kinds == {
        **{"image": "image", "label": "int", "caption": "text", "count": "int"},
        **{"score": "json", "tags": "json", "box": "json"},
    }
    assert result.manifest.options["class_names"] == {"label": NAMES}  # the ClassLabel's
    ds = packer.open_dataset(tmp_path / "o.lmdb")
    images = _hf_bytes(hf)
    for i, row in enumerate(hf):
        got = ds[i]
        assert (
            bytes(packer.open_dataset(tmp_path / "o.lmdb", output="bytes")[i]["image"])
            == (images[i])
        )
        for name in ("label", "caption", "count", "tags", "box"):
            assert got[name] == row[name], (i, name)
        assert got["score"] == pytest.approx(row["score"])


def _write_like_datasets(rows: list[dict], path: Path, template: Path) -> None:
    """Rows written with the schema (metadata included) ``datasets`` gave ``template``."""
    schema = pq.read_schema(template)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def test_bad_rows_are_skipped_and_listed_by_inspect(tmp_path: Path) -> None:
    _images(2).to_parquet(tmp_path / "good.parquet")
    Image.new("RGB", (8, 8), "red").save(tmp_path / "beside.png")
    (tmp_path / "up").mkdir()
    rows = [
        {"image": {"bytes": _jpeg(1), "path": None}, "label": 1},
        {"image": {"bytes": None, "path": None}, "label": 0},
        {"image": {"bytes": b"not an image at all", "path": "x.jpg"}, "label": 0},
        {"image": {"bytes": None, "path": "../secret.png"}, "label": 2},
        {"image": {"bytes": None, "path": "beside.png"}, "label": 2},
        {"image": {"bytes": _jpeg(2), "path": None}, "label": -1},
        {"image": {"bytes": _jpeg(3), "path": None}, "label": 7},
    ]
    _write_like_datasets(rows, tmp_path / "bad.parquet", tmp_path / "good.parquet")
    code, out = _run("convert", tmp_path / "bad.parquet", tmp_path / "o.lmdb")
    assert code == 0, out
    ds = packer.open_dataset(tmp_path / "o.lmdb", output="bytes")
    assert [label for _, label in ds] == [1, 2]
    assert bytes(ds[1][0]) == (tmp_path / "beside.png").read_bytes()
    code, listing = _run("inspect", tmp_path / "o.lmdb", "--skipped")
    assert code == 0, listing
    bad = str(tmp_path / "bad.parquet")
    for row, reason in [
        (1, "neither bytes nor a path"),
        (2, "image"),  # the image check's reason
        (3, "'../secret.png' climbs out"),
        (5, "no label (label is -1)"),
        (6, "label 7 outside the 3 names"),
    ]:
        line = next((x for x in listing.splitlines() if f"{bad}[{row}]" in x), "")
        assert reason in line, (row, listing)


def test_truncated_or_foreign_parquet_is_one_line_error(tmp_path: Path) -> None:
    _images(3).to_parquet(tmp_path / "t.parquet")
    data = (tmp_path / "t.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.parquet").write_text("name,label\na.jpg,1\n")
    for name in ("cut.parquet", "text.parquet"):
        code, out = _run("convert", tmp_path / name, tmp_path / f"{name}.lmdb")
        assert code != 0 and "Traceback" not in out
        assert len(out.strip().splitlines()) == 1 and "cannot be read as Parquet" in out, out


_MEASURE = """
import sys, pyarrow as pa, packer
from packer.write.hf import ROW_GROUPS
packer.convert(sys.argv[1], sys.argv[2], workers=1, progress=False)
print(pa.default_memory_pool().max_memory(), ROW_GROUPS.reads, ROW_GROUPS.most)
"""


def test_memory_is_a_row_group_not_the_file(tmp_path: Path) -> None:
    hf = _images(48 * 40, side=48)  # noise JPEGs (~2 kB each, incompressible)
    src, out = tmp_path / "big.parquet", tmp_path / "big.lmdb"
    hf.to_parquet(src, batch_size=48)  # 40 row groups of 48 rows
    meta = pq.ParquetFile(src).metadata
    assert meta.num_row_groups == 40
    group = max(meta.row_group(g).total_byte_size for g in range(40))
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(src), str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    peak, reads, most = map(int, done.stdout.split())
    assert reads == 40 and most == 2  # each row group decoded once when loading, two held
    # Arrow's memory: the footer (its statistics grow with the row groups) and a few row
    # groups, never the file (~4 MB)
    assert peak < 1.5 * meta.serialized_size + 4 * group < src.stat().st_size / 4, (peak, group)
    _check_images(out, hf)


def test_process_pool_conversion_trains_like_a_class_tree(tmp_path: Path) -> None:
    hf = _images(30)
    hf.to_parquet(tmp_path / "t.parquet", batch_size=7)  # row groups straddle load batches
    result = packer.convert(
        tmp_path / "t.parquet", tmp_path / "o.lmdb", check="full", workers=2, progress=False
    )  # decoding check: a process pool, the loader and its samples pickled
    assert not result.skipped
    _check_images(tmp_path / "o.lmdb", hf)
    ds = packer.open_dataset(tmp_path / "o.lmdb", output="bytes")
    sampler = packer.ShardedSampler(ds, num_replicas=1, rank=0, seed=3)
    loader = torch.utils.data.DataLoader(
        ds, sampler=sampler, batch_size=4, num_workers=2, collate_fn=list
    )
    labels = [label for batch in loader for _, label in batch]
    assert sorted(labels) == sorted(hf["label"]) and labels != hf["label"]  # shuffled, all


def _arrow_like_datasets(table: pa.Table, path: Path, compression: str | None = None) -> None:
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.OSFile(str(path), "wb") as sink:
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table, max_chunksize=3)


def test_arrow_files_compressed_or_truncated_are_one_line_errors(tmp_path: Path) -> None:
    _images(3).save_to_disk(tmp_path / "saved")
    arrow = tmp_path / "saved" / "data-00000-of-00001.arrow"
    with pa.memory_map(str(arrow)) as mm:
        table = pa.ipc.open_stream(mm).read_all()  # its schema keeps the features
    _arrow_like_datasets(table, tmp_path / "plain.arrow")
    result = packer.convert(tmp_path / "plain.arrow", tmp_path / "plain.lmdb", progress=False)
    assert result.manifest.classes == NAMES and result.manifest.num_samples == 3
    _arrow_like_datasets(table, tmp_path / "z.arrow", compression="zstd")
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    for name, says in [("z.arrow", "compressed Arrow file"), ("cut.arrow", "cannot be read")]:
        code, out = _run("convert", tmp_path / name, tmp_path / f"{name}.lmdb")
        assert code != 0 and len(out.strip().splitlines()) == 1 and says in out, out


def test_glob_and_brace_patterns_of_parquet_files(tmp_path: Path) -> None:
    parts = [_images(4), _images(3), _images(2)]
    for i, part in enumerate(parts):
        part.to_parquet(tmp_path / "data" / f"train-{i:05d}-of-00003.parquet")
    _images(5).to_parquet(tmp_path / "data" / "test-00000-of-00001.parquet")
    hf = datasets.concatenate_datasets(parts)
    brace = tmp_path / "data" / "train-{00000..00002}-of-00003.parquet"
    code, out = _run("convert", brace, tmp_path / "brace.lmdb")
    assert code == 0 and "3 Parquet files of datasets matching" in out, out
    _check_images(tmp_path / "brace.lmdb", hf)
    keys = packer.open_dataset(tmp_path / "brace.lmdb").keys
    assert keys[4] == "train-00001-of-00003/000000000"  # each file's rows keyed by its name
    result = packer.convert(tmp_path / "data" / "*.parquet", tmp_path / "glob.lmdb", progress=False)
    assert result.manifest.options["splits"] == {"train": 9, "test": 5}
    code, out = _run("convert", tmp_path / "data" / "val-*.parquet", tmp_path / "none.lmdb")
    assert code != 0 and "matches no Parquet file" in out, out


def test_an_unlabelled_split_is_refused_naming_the_splits_that_convert(tmp_path: Path) -> None:
    test = _images(3).map(lambda row: {"label": -1})  # the Hub's test splits: label -1
    datasets.DatasetDict({"train": _images(4), "test": test}).save_to_disk(tmp_path / "dd")
    code, out = _run("convert", tmp_path / "dd", tmp_path / "o.lmdb")
    assert code != 0 and "split 'test'" in out and "3 × no label (label is -1)" in out, out
    assert "--split train" in out
    code, out = _run("convert", tmp_path / "dd", tmp_path / "o.lmdb", "--split", "train")
    assert code == 0, out
    assert packer.open_dataset(tmp_path / "o.lmdb", split="train").classes == NAMES


class _Files(BaseHTTPRequestHandler):
    """GET (ranged) and HEAD over ``files`` (name -> bytes), with an ETag."""

    files: dict[str, bytes] = {}

    def log_message(self, *args: object) -> None:
        pass

    def _head(self) -> bytes | None:
        data = self.files.get(self.path.lstrip("/"))
        if data is None:
            self.send_error(404)
            return None
        start, stop = 0, len(data)
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start, stop = int(first), min(len(data), int(last) + 1 if last else len(data))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(stop - start))
        self.send_header("ETag", '"v1"')
        self.end_headers()
        return data[start:stop]

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._head()

    def do_GET(self) -> None:  # noqa: N802
        data = self._head()
        if data is not None:
            self.wfile.write(data)


def test_parquet_files_at_a_url_convert_into_their_splits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    train, val = [_images(4), _images(3)], _images(2)
    handler = type("Handler", (_Files,), {"files": {}})
    for i, part in enumerate(train):
        part.to_parquet(tmp_path / "p.parquet")
        handler.files[f"data/train-{i:05d}-of-00002.parquet"] = (
            tmp_path / "p.parquet"
        ).read_bytes()
    val.to_parquet(tmp_path / "p.parquet")
    handler.files["data/validation-00000-of-00001.parquet"] = (tmp_path / "p.parquet").read_bytes()
    served = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{served.server_address[1]}/data"
        url = (
            base + "/{train-00000-of-00002,train-00001-of-00002,validation-00000-of-00001}.parquet"
        )
        code, out = _run("convert", url, tmp_path / "o.lmdb")
        assert code == 0, out
        _check_images(tmp_path / "o.lmdb", datasets.concatenate_datasets(train), split="train")
        _check_images(tmp_path / "o.lmdb", val, split="validation")
        code, out = _run("convert", base + "/test-00000-of-00001.parquet", tmp_path / "t.lmdb")
        assert code != 0 and "the object is missing" in out and len(out.splitlines()) == 1
    finally:
        served.shutdown()
        served.server_close()
