"""The LMDB reader's batch paths: one ``getmulti`` or one cursor walk per shard, in the order
asked; the record-order check at open that lets it skip a key range check per read; a damaged
shard (a record missing) refused on every path."""

from __future__ import annotations

import importlib.util
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import lmdb
import numpy as np
import pytest

import packer
from packer.demo.image import make_image_tree
from packer.errors import FormatError
from packer.formats.lmdb import record_key
from packer.read import rows
from packer.source.images import scan

# Batches by the first record of shard 1 (``b``, at least 4): within shard 0 unless they say.
BATCHES: dict[str, Callable[[int], list[int]]] = {
    "a consecutive run": lambda b: [0, 1, 2, 3],
    "shard 0 to its last record": lambda b: list(range(1, b)),
    "a run across shards": lambda b: list(range(19)),
    "the whole dataset": lambda b: list(range(20)),
    "descending": lambda b: [b - 1, b - 2, b - 3, b - 4],
    "shuffled": lambda b: [b - 2, 0, b - 1, 1],
    "shuffled across shards": lambda b: [9, 2, 17, 0, 11, 5],
    "a duplicate": lambda b: [1, 1, 2],
    "a duplicate spanning a run's length": lambda b: [0, 0, 2],
    "a gap": lambda b: [0, 2],
    "negative indices": lambda b: [-1, -20, 1],
    "the last record": lambda b: [19],
    "none": lambda b: [],
}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[bytes], list[int]]:
    """20 tiny JPEGs in 2 classes; their bytes and labels in dataset order."""
    tree = make_image_tree(
        tmp_path_factory.mktemp("lmdbsrc") / "images", classes=2, per_class=10, size=(32, 24), bad=0
    )
    samples = scan(tree.root).samples
    return tree.root, [Path(s.path).read_bytes() for s in samples], [s.label for s in samples]


@pytest.fixture(scope="module")
def output(
    source: tuple[Path, list[bytes], list[int]], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The LMDB output of ``source``, in shards of several records each."""
    dst = tmp_path_factory.mktemp("lmdbout") / "images.lmdb"
    packer.convert(source[0], dst, shard_size="8kB", progress=False)
    counts = [s["samples"] for s in json.loads((dst / "packer.json").read_text())["shards"]]
    assert len(counts) >= 3 and counts[0] >= 4, counts
    return dst


@pytest.mark.parametrize("readahead", [True, False])
@pytest.mark.parametrize("what", list(BATCHES))
def test_a_batch_reads_the_stored_bytes_in_the_order_asked(
    source: tuple[Path, list[bytes], list[int]], output: Path, what: str, readahead: bool
) -> None:
    _, data, labels = source
    first_of_shard_1 = json.loads((output / "packer.json").read_text())["shards"][0]["samples"]
    batch = BATCHES[what](first_of_shard_1)
    expected = [(data[i], labels[i]) for i in batch]
    with packer.LMDBDataset(output, output="bytes", readahead=readahead) as dataset:
        assert dataset.__getitems__(batch) == expected
        assert dataset.__getitems__(np.array(batch, dtype=np.int64)) == expected
        records = dataset.first[np.array(batch, dtype=np.int64)]
        assert dataset.reader.read_many(records) == [d for d, _ in expected]
    with packer.LMDBDataset(output, output="bytes", batch_buffer=True) as buffered:
        got = buffered.__getitems__(batch)
        flat = got.data.numpy().tobytes()
        pieces = [flat[a:b] for a, b in zip(got.offsets[:-1], got.offsets[1:])]
        assert pieces == [d for d, _ in expected] and list(got.labels) == labels_of(batch, labels)


def labels_of(batch: list[int], labels: list[int]) -> list[int]:
    return [labels[i] for i in batch]


def test_records_outside_the_dataset_are_refused(output: Path) -> None:
    with packer.LMDBDataset(output, output="bytes") as dataset:
        n = len(dataset.reader)
        for records in ([n], [0, n], [-1], [3, -1, 2]):
            with pytest.raises(IndexError, match=f"dataset of {n} records"):
                dataset.reader.read_many(records)
        with pytest.raises(IndexError, match="index 20 out of range"):
            dataset.__getitems__([0, 20])
        with pytest.raises(TypeError):
            dataset.__getitems__([0.0, 1.0])


def reseal(root: Path, records: np.ndarray | None = None) -> dict:  # type: ignore[type-arg]
    """Write ``records`` (if given) and record the tables' checksums and the shards' sizes in
    the manifest again, as a careful forger would."""
    import xxhash

    manifest = json.loads((root / "packer.json").read_text())
    if records is not None:
        np.save(root / "records.npy", records)
        digest = xxhash.xxh3_64((root / "records.npy").read_bytes()).hexdigest()
        manifest["files"]["records.npy"] = digest
    for shard in manifest["shards"]:
        shard["bytes"] = (root / shard["name"]).stat().st_size
    (root / "packer.json").write_text(json.dumps(manifest))
    return manifest


@pytest.mark.parametrize("block", [rows.BLOCK, 1, 4])
@pytest.mark.parametrize("suffix", [".lmdb", ".npy"])
def test_records_out_of_shard_order_are_refused_at_open(
    source: tuple[Path, list[bytes], list[int]],
    tmp_path: Path,
    suffix: str,
    block: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The last record of shard 0 and the first of shard 1 swap shards: every shard keeps its
    record count, but shard 0's records are no longer one run (an LMDB key is a record's
    position in its run). The tables are checked in blocks of samples: the step back is found
    inside a block and across two (``block``: samples per block)."""
    monkeypatch.setattr(rows, "BLOCK", block)
    root = tmp_path / f"images{suffix}"
    packer.convert(source[0], root, shard_size="8kB", progress=False)
    records = np.load(root / "records.npy")
    boundary = int(np.flatnonzero(records["file"] == 1)[0])
    records["file"][[boundary - 1, boundary]] = [1, 0]
    reseal(root, records)
    with pytest.raises(FormatError) as refused:
        packer.open_dataset(root)
    message = str(refused.value)
    assert str(root) in message and f"row {boundary})" in message
    assert "earlier shard than the record before it" in message
    assert message.endswith("Convert the source again")


def test_a_shard_missing_a_record_is_refused_on_every_path(
    source: tuple[Path, list[bytes], list[int]], output: Path, tmp_path: Path
) -> None:
    """Record 1 of shard 0 deleted (the shard then no longer matches its checksum, which only
    ``verify`` reads): a read that needs it fails with a FormatError whether it walks the
    cursor over a run or looks keys up; reads around it still give the stored bytes."""
    root = Path(shutil.copytree(output, tmp_path / "damaged.lmdb"))
    shard = root / json.loads((root / "packer.json").read_text())["shards"][0]["name"]
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        assert txn.delete(record_key(1))
    env.close()
    reseal(root)
    _, data, labels = source
    with packer.LMDBDataset(root, output="bytes") as dataset:
        for batch in ([0, 1, 2], [1, 2, 3], [0, 1], [1, 3], [3, 1], [1]):
            with pytest.raises(FormatError, match="missing from|not consecutive") as refused:
                dataset.__getitems__(batch)
            assert shard.name in str(refused.value)
        assert dataset.__getitems__([2, 3]) == [(data[i], labels[i]) for i in (2, 3)]
        assert dataset.__getitems__([0, 2]) == [(data[i], labels[i]) for i in (0, 2)]


def test_the_benchmark_compares_packer_with_the_plain_reader(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script("lmdb_reader")
    args = ["--data", str(tmp_path), "--images", "20", "--repeats", "2", "--wait-budget", "0"]
    assert script.main(script.parse_args([*args, "--in-process", "--out", str(tmp_path)])) == 0
    out = capsys.readouterr().out
    assert "| lmdb | 0 |" in out and "| plain lmdb | 0 |" in out and "| jpeg folder | 0 |" in out
    assert "packer's LMDB reader is" in out and "the plain reader" in out
    report = json.loads((tmp_path / "lmdb_reader.json").read_text())
    assert report["benchmark"] == "lmdb_reader" and report["images"] == 20
    (check,) = report["packer_vs_plain"]
    assert len(check["packer_vs_plain_per_round"]) == 2 and check["packer_vs_plain"] > 0
    assert {r["dataset"] for r in report["results"]} == {"jpeg folder", "lmdb", "plain lmdb"}
    assert all(r["images_per_s"] > 0 and len(r["runs"]) == 2 for r in report["results"])


def _script(name: str) -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
