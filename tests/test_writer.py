"""packer.Writer: samples from the user's own code into an ordinary dataset with fields.

Round trips through the public API for each format and every kind of value; the same bytes as
``convert`` of key-grouped files; every refusal, raised at ``write()`` with the samples written so
far kept; memory bounded by a shard; workers under fork and spawn; a real ``kill -9``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from PIL import Image
from torch.utils.data import DataLoader

import packer
from packer.cli.app import main
from packer.demo.fields import make_caption_set

FORMATS = [".lmdb", ".npy", ".h5"]


def arrays() -> dict[str, Any]:
    """Arrays of many dtypes and shapes (numpy and torch), as the field ``name.npy``."""
    rng = np.random.default_rng(0)
    grid = rng.standard_normal((4, 6))
    return {
        "f64.npy": grid,
        "i8.npy": rng.integers(-128, 127, (2, 3, 4), dtype=np.int8),
        "u16be.npy": np.arange(7, dtype=">u2"),
        "flag.npy": np.array([True, False, True]),
        "c64.npy": (grid + 1j * grid).astype(np.complex64),
        "scalar.npy": np.float32(2.5),
        "empty.npy": np.zeros((0, 3), dtype=np.int32),
        "strided.npy": grid[::2, ::3],  # not contiguous
        "fortran.npy": np.asfortranarray(grid),
        "t32.npy": torch.linspace(0, 1, 5),
        "t16.npy": torch.arange(6, dtype=torch.float16).reshape(2, 3),
        "ti64.npy": torch.tensor([[1, -2], [3, 2**40]]),
        "tgrad.npy": torch.ones(3, requires_grad=True),
    }


def expected_array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return np.asarray(value)


def sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    out: dict[str, Any] = {
        "__key__": f"s{i:04d}",
        "bin": bytes(rng.integers(0, 256, 50 + i, dtype=np.uint8)),
        "txt": f"caption {i}: café ☕",
        "cls": i - 3,
        "json": {"id": i, "tags": ["a", "b"], "nested": {"x": 1.5}},
        "list.json": [i, None, "z"],
        "png": rng.integers(0, 256, (9, 11, 3), dtype=np.uint8),
        "mask.png": Image.fromarray(rng.integers(0, 4, (9, 11), dtype=np.uint8), mode="L"),
        "rgba.png": rng.integers(0, 256, (5, 4, 4), dtype=np.uint8),
        "jpg": rng.integers(0, 256, (16, 16, 3), dtype=np.uint8),
    }
    if i % 2 == 0:
        out |= arrays()
    return out


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("written")
    out = {}
    for suffix in FORMATS:
        with packer.Writer(root / f"out{suffix}", shard_size=20_000) as writer:
            for i in range(12):
                writer.write(sample(i))
        out[suffix] = root / f"out{suffix}"
    return out


@pytest.mark.parametrize("suffix", FORMATS)
def test_every_kind_of_value_reads_back_equal(suffix: str, written: dict[str, Path]) -> None:
    path = written[suffix]
    assert not path.with_name(path.name + ".partial").exists()
    manifest = json.loads((path / "packer.json").read_text())
    assert (
        manifest["format"] == suffix.lstrip(".").replace("h5", "hdf5")
        and len(manifest["shards"]) > 1
    )  # several shards
    ds = packer.open_dataset(path, output="numpy")
    raw = packer.open_dataset(path, output="bytes")
    assert isinstance(ds, packer.FieldDataset) and len(ds) == 12
    for i in range(12):
        want, got = sample(i), ds[i]
        assert got["__key__"] == want["__key__"]
        assert raw[i]["bin"] == got["bin"] == want["bin"]  # bytes stored unchanged
        assert got["txt"] == want["txt"] and got["cls"] == want["cls"]
        assert got["json"] == want["json"] and got["list.json"] == want["list.json"]
        assert np.array_equal(got["png"], want["png"])  # PNG: lossless
        assert np.array_equal(got["mask.png"][..., 0], np.asarray(want["mask.png"]))
        assert Image.open(io.BytesIO(raw[i]["rgba.png"])).mode == "RGBA"
        assert np.array_equal(
            np.asarray(Image.open(io.BytesIO(raw[i]["rgba.png"]))), want["rgba.png"]
        )
        assert raw[i]["jpg"][:2] == b"\xff\xd8" and got["jpg"].shape == (16, 16, 3)
        for name, value in arrays().items():
            if i % 2:
                assert got[name] is None  # a field a sample lacks is absent
                continue
            back, exp = got[name], expected_array(value)
            assert (back.dtype, back.shape) == (exp.dtype, exp.shape), name
            assert np.array_equal(back, exp), name
    assert packer.verify(path, progress=False).problems == []


def test_the_dataset_is_an_ordinary_one(written: dict[str, Path]) -> None:
    """fields=, ShardedSampler, inspect and verify --full work on it unchanged."""
    path = written[".lmdb"]
    pairs = packer.open_dataset(path, fields=("txt", "cls"))
    assert pairs[2] == ("caption 2: café ☕", -1)
    order = list(packer.ShardedSampler(pairs, num_replicas=2, rank=0, seed=1))
    other = list(packer.ShardedSampler(pairs, num_replicas=2, rank=1, seed=1))
    assert sorted(order + other) == list(range(12))
    run = CliRunner().invoke(main, ["inspect", str(path)])
    assert run.exit_code == 0, run.output
    assert "field txt (text): 12 samples" in run.output and "packer.Writer" in run.output
    run = CliRunner().invoke(main, ["verify", str(path), "--full", "-q"])
    assert run.exit_code == 0, run.output


def test_same_bytes_as_convert_of_key_grouped_files(tmp_path: Path) -> None:
    """Written from the files' bytes, the shards, tables and keys are convert's, byte for byte."""
    source = make_caption_set(tmp_path / "pairs", samples=30, size=(40, 30))
    for suffix in FORMATS:
        converted = tmp_path / f"conv{suffix}"
        packer.convert(tmp_path / "pairs", converted, shard_size=30_000, workers=1, progress=False)
        mine = tmp_path / f"mine{suffix}"
        with packer.Writer(mine, shard_size=30_000) as writer:
            for key in sorted(source):
                writer.write({"__key__": key, **source[key]})
        names = sorted(p.name for p in converted.iterdir() if p.name != "packer.json")
        assert names == sorted(p.name for p in mine.iterdir() if p.name != "packer.json")
        assert len([n for n in names if n.startswith("shard-")]) > 1
        for name in names:
            assert (converted / name).read_bytes() == (mine / name).read_bytes(), (suffix, name)
        theirs, ours = (json.loads((p / "packer.json").read_text()) for p in (converted, mine))
        assert ours["shards"] == theirs["shards"] and ours["files"] == theirs["files"]
        assert ours["options"]["fields"] == theirs["options"]["fields"]


def test_jpeg_quality_is_stated_and_settable(tmp_path: Path) -> None:
    pixels = np.random.default_rng(1).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    sizes = {}
    for quality in (30, 95):
        path = tmp_path / f"q{quality}.lmdb"
        with packer.Writer(path, jpeg_quality=quality) as writer:
            writer.write({"__key__": "a", "jpg": pixels})
        data = packer.open_dataset(path, output="bytes")[0]["jpg"]
        expected = io.BytesIO()
        Image.fromarray(pixels).save(expected, format="JPEG", quality=quality)
        assert data == expected.getvalue()
        sizes[quality] = len(data)
        assert json.loads((path / "packer.json").read_text())["options"]["jpeg_quality"] == quality
    assert sizes[30] < sizes[95]
    assert packer.write.writer.DEFAULT_JPEG_QUALITY == 90
    for bad in (0, 101, 9.5, True):
        with pytest.raises(packer.PackerError, match="jpeg_quality"):
            packer.Writer(tmp_path / "bad.lmdb", jpeg_quality=bad)
    assert not (tmp_path / "bad.lmdb.partial").exists()


class _Odd:
    pass


REFUSED = [
    ("txt", b"\xff\xfe", "not UTF-8"),
    ("txt", 3, "takes a str"),
    ("txt", "\ud800", "lone surrogate"),
    ("cls", "3", "takes an int"),
    ("cls", True, "takes an int"),
    ("cls", 2**63, "beyond int64"),
    ("cls", -(2**63) - 1, "beyond int64"),
    ("cls", b"x1", "not an integer"),
    ("json", (1, 2), "takes a dict or a list"),
    ("json", {1: "a"}, "read back equal"),
    ("json", [float("nan")], "not JSON"),
    ("json", {"a": _Odd()}, "not JSON"),
    ("json", b"{", "not JSON"),
    ("npy", [1, 2], "takes a numpy array"),
    ("npy", np.array(["a"]), "numeric dtype"),
    ("npy", np.array([object()]), "numeric dtype"),
    ("npy", torch.ones(2, dtype=torch.bfloat16), "no numpy equivalent"),
    ("npy", b"not npy", "not an .npy"),
    ("jpg", b"not a jpeg", "image"),
    ("jpg", np.zeros((4, 4), dtype=np.float32), "uint8"),
    ("jpg", np.zeros((4, 4, 2), dtype=np.uint8), "uint8 pixels"),
    ("jpg", np.zeros((0, 4), dtype=np.uint8), "no pixels"),
    ("jpg", np.zeros((4, 4, 4), dtype=np.uint8), "JPEG cannot hold"),
    ("jpg", torch.zeros(3, 4, 4, dtype=torch.uint8), "takes a PIL image"),
    ("gif", np.zeros((4, 4), dtype=np.uint8), "not encoded as .gif"),
    ("bin", "text", "takes bytes"),
    ("bin", None, "leave the field out"),
]


@pytest.mark.parametrize(("field", "value", "reason"), REFUSED)
def test_a_value_its_field_cannot_take_is_refused_at_write(
    tmp_path: Path, field: str, value: Any, reason: str
) -> None:
    path = tmp_path / "out.lmdb"
    with packer.Writer(path, shard_size=200) as writer:
        for i in range(3):
            writer.write({"__key__": f"k{i}", "txt": "x" * 150, "cls": i, "npy": np.arange(i)})
        with pytest.raises(packer.PackerError, match=reason) as caught:
            writer.write({"__key__": "bad", field: value})
        assert "'bad'" in str(caught.value) and f"field {field!r}" in str(caught.value)
        writer.write({"__key__": "k3", "txt": "after", "cls": 3})
    ds = packer.open_dataset(path)
    assert list(ds.keys) == ["k0", "k1", "k2", "k3"]  # the samples before and after kept
    assert [ds[i]["cls"] for i in range(4)] == [0, 1, 2, 3]


def test_keys_and_field_names_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "out.npy"
    with packer.Writer(path) as writer:
        writer.write({"__key__": "a/b", "txt": "x"})
        refusals = [
            ({"__key__": "a/b", "txt": "y"}, "written before"),
            ({"__key__": "A/B", "txt": "y"}, "ignoring case"),
            ({"txt": "y"}, "'__key__': missing"),
            ({"__key__": 7, "txt": "y"}, "not a string"),
            ({"__key__": "", "txt": "y"}, "empty"),
            ({"__key__": "../up", "txt": "y"}, "not a plain relative name"),
            ({"__key__": "/abs", "txt": "y"}, "not a plain relative name"),
            ({"__key__": "x\0", "txt": "y"}, "not a plain relative name"),
            ({"__key__": "\udcff", "txt": "y"}, "not encodable"),
            ({"__key__": "c", "JPG": b"y"}, "not a plain name"),
            ({"__key__": "c", "a b": b"y"}, "not a plain name"),
            ({"__key__": "c", "__meta__": b"y"}, "not a plain name"),
            ({"__key__": "c", 3: b"y"}, "not a plain name"),
            ({"__key__": "c"}, "no field besides"),
            (["c", "y"], "not a dict"),
        ]
        for bad, reason in refusals:
            with pytest.raises(packer.PackerError, match=reason):
                writer.write(bad)
        assert len(writer) == 1
    assert list(packer.open_dataset(path).keys) == ["a/b"]


def test_fields_are_fixed_by_the_first_shard_or_declared(tmp_path: Path) -> None:
    path = tmp_path / "out.lmdb"
    with packer.Writer(path, shard_size=100) as writer:
        writer.write({"__key__": "0", "txt": "a" * 60})
        writer.write({"__key__": "1", "cls": 1})  # still the first shard: a new field is fine
        with pytest.raises(packer.PackerError, match="'2', field 'json': a new field") as caught:
            writer.write({"__key__": "2", "txt": "b" * 60, "json": {}})  # starts shard 2
        assert "fields=" in str(caught.value)
        writer.write({"__key__": "3", "txt": "c" * 60})
        writer.write({"__key__": "4", "cls": 4})  # lacks txt: absent
        assert writer.fields == ["cls", "txt"]
    ds = packer.open_dataset(path)
    assert [(ds[i]["txt"], ds[i]["cls"]) for i in range(4)] == [
        ("a" * 60, None),
        (None, 1),
        ("c" * 60, None),
        (None, 4),
    ]
    declared = tmp_path / "declared.lmdb"
    with packer.Writer(declared, fields=["txt", "json"]) as writer:
        writer.write({"__key__": "0", "txt": "a"})
        with pytest.raises(packer.PackerError, match="not one of the fields declared"):
            writer.write({"__key__": "1", "cls": 1})
    assert packer.open_dataset(declared).fields == ("json", "txt")
    assert packer.open_dataset(declared)[0]["json"] is None
    for bad in ("txt", ["txt", "txt"], [], ["Bad"]):
        with pytest.raises(packer.PackerError, match="fields="):
            packer.Writer(tmp_path / "x.lmdb", fields=bad)


def test_destination_refusals(tmp_path: Path) -> None:
    path = tmp_path / "out.h5"
    with packer.Writer(path) as writer:
        writer.write({"__key__": "a", "txt": "old"})
        with pytest.raises(packer.PackerError, match="being written by another"):
            packer.Writer(path)
    with pytest.raises(packer.PackerError, match="exists; pass --overwrite"):
        packer.Writer(path)
    with packer.Writer(path, overwrite=True) as writer:
        writer.write({"__key__": "b", "txt": "new"})
    assert list(packer.open_dataset(path).keys) == ["b"]
    with pytest.raises(packer.PackerError, match="one decoded image per file"):
        packer.Writer(tmp_path / "out.bmp")
    with pytest.raises(packer.PackerError, match="unknown destination suffix"):
        packer.Writer(tmp_path / "out.zip")
    with pytest.raises(packer.PackerError, match="storage_options apply to a URL"):
        packer.Writer(tmp_path / "o.lmdb", storage_options={"anon": True})
    with pytest.raises(packer.PackerError, match="no sample was written"):
        with packer.Writer(tmp_path / "empty.lmdb"):
            pass
    assert not (tmp_path / "empty.lmdb").exists() and not (tmp_path / "empty.lmdb.partial").exists()
    writer = packer.Writer(tmp_path / "twice.lmdb")
    writer.write({"__key__": "a", "txt": "x"})
    assert writer.close() is writer.close()  # closing again returns the manifest
    with pytest.raises(packer.PackerError, match="is closed"):
        writer.write({"__key__": "b", "txt": "x"})


def test_an_exception_inside_the_with_leaves_no_dataset(tmp_path: Path) -> None:
    path = tmp_path / "out.lmdb"
    with pytest.raises(ZeroDivisionError):
        with packer.Writer(path, shard_size=100) as writer:
            for i in range(5):
                writer.write({"__key__": str(i), "txt": "x" * 80})
            1 / 0  # noqa: B018
    assert not path.exists()
    partial = tmp_path / "out.lmdb.partial"
    assert (partial / "shard-00000.mdb").is_file() and not (partial / "packer.json").exists()
    with pytest.raises(packer.PackerError):
        packer.open_dataset(path)
    with pytest.raises(packer.PackerError, match="interrupted write"):
        packer.Writer(path)
    with packer.Writer(path, overwrite=True) as writer:
        writer.write({"__key__": "z", "txt": "fresh"})
    assert list(packer.open_dataset(path).keys) == ["z"] and not partial.exists()


def test_memory_stays_bounded_by_a_shard(tmp_path: Path) -> None:
    """32 MB of samples through 1 MiB shards: the writer holds about one shard (plus the 1 MiB
    read buffer a shard's checksum takes), never the samples written before."""
    shard, value, count = 1 << 20, 32 << 10, 1024
    payloads = [os.urandom(value) for _ in range(4)]  # made before tracing: the user's data
    writer = packer.Writer(tmp_path / "out.lmdb", shard_size=shard)
    writer.write({"__key__": "warm", "bin": payloads[0]})
    tracemalloc.start()
    try:
        for i in range(count):
            writer.write({"__key__": f"{i:05d}", "bin": payloads[i % 4], "txt": str(i)})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    writer.close()
    assert peak < 2 * shard + (3 << 19), (peak, count * value)  # 3.5 MiB of 32 MiB written
    ds = packer.open_dataset(tmp_path / "out.lmdb", output="bytes")
    assert len(ds) == count + 1 and len(ds.manifest.shards) > 30
    assert ds[count]["bin"] == payloads[(count - 1) % 4]


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_workers_read_a_written_dataset(context: str, written: dict[str, Path]) -> None:
    ds = packer.open_dataset(written[".npy"], fields=("cls", "txt", "f64.npy"))
    loader = DataLoader(
        ds,
        batch_size=5,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=packer.collate_fields,
    )
    seen = []
    for clss, txts, grids in loader:
        seen += clss.tolist()
        assert all(t.startswith("caption") for t in txts)
        assert all(g is None or g.shape == (4, 6) for g in grids)
    assert sorted(seen) == [i - 3 for i in range(12)]


KILLED = textwrap.dedent(
    """
    import sys, packer, numpy as np
    with packer.Writer(sys.argv[1], shard_size=4096) as w:
        for i in range(10**9):
            w.write({"__key__": f"{i:08d}", "npy": np.full(256, i), "txt": "x" * 100})
    """
)


def test_a_kill_9_mid_write_leaves_only_the_partial(tmp_path: Path) -> None:
    path = tmp_path / "out.lmdb"
    partial = tmp_path / "out.lmdb.partial"
    child = subprocess.Popen([sys.executable, "-c", KILLED, str(path)])
    try:
        deadline = time.monotonic() + 120
        while not (partial / "_progress" / "shard-00003.json").exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        child.kill()
    assert not path.exists() and partial.is_dir()
    assert not (partial / "packer.json").exists()
    with pytest.raises(packer.PackerError):
        packer.open_dataset(path)
    with pytest.raises(packer.PackerError, match="interrupted write"):
        packer.Writer(path)
    with packer.Writer(path, overwrite=True) as writer:
        writer.write({"__key__": "new", "txt": "after the kill"})
    assert packer.open_dataset(path)[0]["txt"] == "after the kill"
    assert packer.verify(path, progress=False).problems == []


BUCKET = "writer"  # the module's bucket on the S3 server (conftest)


def test_a_writer_to_a_url_uploads_the_same_dataset(server: Any, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/pairs.lmdb"
    options = server.options
    local = tmp_path / "local.lmdb"
    for dst in (url, local):
        with packer.Writer(
            dst, shard_size=20_000, storage_options=options if dst == url else None,
            **({"staging": tmp_path / "staging"} if dst == url else {}),
        ) as writer:  # fmt: skip
            for i in range(8):
                writer.write(sample(i))
    fs = server.filesystem()
    root = url.split("://", 1)[1]
    uploaded = {p[len(root) + 1 :]: fs.cat_file(p) for p in fs.find(url)}
    on_disk = {p.name: p.read_bytes() for p in local.iterdir()}
    assert sorted(uploaded) == sorted(on_disk) and len(uploaded) > 5
    for name, data in on_disk.items():
        if name != "packer.json":
            assert uploaded[name] == data, name
    remote = packer.open_dataset(url, storage_options=options, output="numpy")
    assert remote[5]["txt"] == sample(5)["txt"]
    assert packer.verify(url, storage_options=options, progress=False).problems == []
    assert not any((tmp_path / "staging").iterdir())  # the staging folder is gone
    with pytest.raises(packer.PackerError, match="already holds a packer dataset"):
        packer.Writer(url, storage_options=options, staging=tmp_path / "staging")


def test_a_failed_writer_to_a_url_leaves_no_dataset_there(server: Any, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/failed.lmdb"
    with pytest.raises(ZeroDivisionError):
        with packer.Writer(
            url, shard_size=2_000, storage_options=server.options, staging=tmp_path / "s"
        ) as writer:
            for i in range(6):
                writer.write(sample(i))
            1 / 0  # noqa: B018
    names = [p.rsplit("/", 1)[-1] for p in server.filesystem().find(url)]
    assert "packer.json" not in names
    with pytest.raises(packer.PackerError):
        packer.open_dataset(url, storage_options=server.options)


KILLED_URL = textwrap.dedent(
    """
    import sys, packer, numpy as np
    options = {"endpoint_url": sys.argv[2]}
    with packer.Writer(sys.argv[1], shard_size=4096, storage_options=options, staging=sys.argv[3]) as w:
        for i in range(10**9):
            w.write({"__key__": f"{i:08d}", "npy": np.full(256, i), "txt": "x" * 100})
    """
)


def test_a_kill_9_mid_write_to_a_url_leaves_no_dataset_there(server: Any, tmp_path: Path) -> None:
    url = f"s3://{BUCKET}/killed.lmdb"
    fs = server.filesystem()
    args = [sys.executable, "-c", KILLED_URL, url, server.endpoint, str(tmp_path / "staging")]
    child = subprocess.Popen(args)
    try:
        deadline = time.monotonic() + 120
        while len(fs.find(url)) < 3:  # shards already uploaded while it writes
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
            fs.invalidate_cache()
        child.send_signal(signal.SIGKILL)
        child.wait()
    finally:
        child.kill()
    fs.invalidate_cache()
    names = [p.rsplit("/", 1)[-1] for p in fs.find(url)]
    assert names and "packer.json" not in names
    with pytest.raises(packer.PackerError):
        packer.open_dataset(url, storage_options=server.options)
    with packer.Writer(url, storage_options=server.options, staging=tmp_path / "staging") as w:
        w.write({"__key__": "again", "txt": "after the kill"})
    assert packer.open_dataset(url, storage_options=server.options)[0]["txt"] == "after the kill"
