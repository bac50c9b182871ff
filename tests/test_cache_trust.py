"""Issue 28, items 5-6: the node-local shard cache is not trusted blindly. A byte flipped in a
cached shard of each cached format (LMDB, NPY, HDF5) is never served, in the reading process or
in DataLoader workers: the record's xxh3 differs, the shard is downloaded again and replaced,
the cache ends healthy; a second difference (a fresh download agreeing with the manifest) is an
error naming the sample and the URL. Links, hard links and other users' files planted in the
cache folder are refused or replaced, never written through (each target checked untouched).
A real S3 API server (moto) behind the fault proxy; downloads counted by the proxy's log."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fault_proxy import FaultProxy
from s3_server import S3Server
from torch.utils.data import DataLoader

import packer
from packer import storage
from packer.cache import wait_for_downloads
from packer.errors import FormatError
from packer.manifest import MANIFEST_NAME, file_checksum, load_manifest
from packer.tools.image_demo import make_image_tree

BUCKET = "trust"
CACHED = ["images.lmdb", "images.npy", "images.h5"]


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch, proxy: FaultProxy) -> Iterator[None]:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01, cap=0.02))
    proxy.inject([])
    yield
    proxy.release()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trust_src")
    images = make_image_tree(root / "images", classes=3, per_class=4, size=(64, 48), bad=0)
    out = {}
    for name in CACHED:
        out[name] = root / name
        packer.convert(images.root, out[name], shard_size="6kB", workers=1, progress=False)
        assert len(load_manifest(out[name]).shards) >= 3
    return out


def _upload(server: S3Server, local: Path, name: str) -> str:
    fs = server.filesystem()
    if fs.exists(f"s3://{BUCKET}/{name}"):
        fs.rm(f"s3://{BUCKET}/{name}", recursive=True)
    return server.upload(local, name)


def _options(proxy: FaultProxy, cache: Path) -> dict[str, Any]:
    return {
        "output": "bytes",
        "storage_options": {"endpoint_url": proxy.endpoint},
        "cache_dir": cache,
    }


def _shard_gets(proxy: FaultProxy, name: str) -> Counter[str]:
    prefix = f"GET /{BUCKET}/{name}/shard-"
    return Counter(
        line.split(" ", 2)[1].split("?")[0].rsplit("/", 1)[1]
        for line in proxy.served
        if line.startswith(prefix)
    )


def _every(dataset: Any) -> list[bytes]:
    return [dataset[i][0] for i in range(len(dataset))]


def _list(batch: list) -> list:
    return batch


def _loaded(dataset: Any, workers: int) -> list[bytes]:
    context = "fork" if workers else None
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=workers,
        multiprocessing_context=context,
        collate_fn=_list,
    )
    return [data for batch in loader for data, _ in batch]


def _warm(url: str, options: dict[str, Any]) -> None:
    """Every shard of ``url`` in the cache (read once, background downloads waited for)."""
    dataset = packer.open_dataset(url, **options)
    _every(dataset)
    assert wait_for_downloads(30)
    dataset.close()


def _keys(cache: Path) -> dict[str, str]:
    """Shard name -> its entry's key, from the entries' ``K.json``."""
    out = {}
    for path in cache.glob("*.json"):
        out[json.loads(path.read_text())["url"].rsplit("/", 1)[1]] = path.stem
    return out


def _first_record(local: Path, shard: int) -> tuple[int, int]:
    """The byte offset and length of shard ``shard``'s first record in its file."""
    records = np.load(local / "records.npy")
    first = int(np.flatnonzero(records["file"] == shard)[0])
    return int(records["offset"][first]), int(records["length"][first])


def _flip(path: Path, at: int) -> None:
    """One byte of ``path`` flipped in place (a disk's bit rot, a file tampered with)."""
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x40]))


def _healthy(cache: Path, local: Path) -> None:
    """Every cached shard is the stored one, nothing partial or odd is left."""
    shards = load_manifest(local).shards
    keys = _keys(cache)
    assert sorted(keys) == sorted(s.name for s in shards)
    for shard in shards:
        data = cache / (keys[shard.name] + ".data")
        assert not data.is_symlink() and data.stat().st_uid == os.geteuid()
        assert data.read_bytes() == (local / shard.name).read_bytes(), shard.name
    assert not list(cache.glob("*.part"))


def _read_into(dataset: Any) -> list[bytes]:
    """Every record through ``read_into`` (the path of decoders that fill one buffer)."""
    reader, n = dataset.reader, len(dataset)
    lengths = reader.length[:n].tolist()
    where = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    out = bytearray(sum(lengths))
    reader.read_into(np.arange(n), memoryview(out), where)
    return [bytes(out[w : w + k]) for w, k in zip(where.tolist(), lengths)]


@pytest.mark.parametrize("workers", [0, 2, "read_into"])
@pytest.mark.parametrize("name", CACHED)
def test_a_flipped_byte_in_a_cached_shard_is_never_served(
    server: S3Server,
    proxy: FaultProxy,
    local: dict[str, Path],
    tmp_path: Path,
    name: str,
    workers: Any,
) -> None:
    url = _upload(server, local[name], f"flip{workers}-{name}")
    cache = tmp_path / "cache"
    options = _options(proxy, cache)
    expected = _every(packer.open_dataset(local[name], output="bytes"))
    _warm(url, options)
    shard = load_manifest(local[name]).shards[1].name
    offset, length = _first_record(local[name], 1)
    _flip(cache / (_keys(cache)[shard] + ".data"), offset + length // 2)
    before = _shard_gets(proxy, f"flip{workers}-{name}")
    dataset = packer.open_dataset(url, **options)
    if workers == "read_into":
        assert _read_into(dataset) == expected
    else:
        assert _loaded(dataset, workers) == expected
    fetched = _shard_gets(proxy, f"flip{workers}-{name}") - before
    assert fetched == Counter({shard: 1})  # that shard downloaded again, once for the node
    _healthy(cache, local[name])


@pytest.mark.parametrize("name", ["images.lmdb", "images.npy"])
def test_a_record_that_differs_after_a_fresh_download_is_an_error(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """The store's shard and the manifest agree, the record table does not: the cached copy is
    downloaded again once, then the read fails naming the sample and the URL."""
    bent = tmp_path / name
    shutil.copytree(local[name], bent)
    shard = load_manifest(bent).shards[1].name
    offset, length = _first_record(bent, 1)
    _flip(bent / shard, offset + length // 2)
    manifest = json.loads((bent / MANIFEST_NAME).read_text())
    manifest["shards"][1]["xxh3_64"] = file_checksum(bent / shard)
    (bent / MANIFEST_NAME).write_text(json.dumps(manifest))
    url = _upload(server, bent, f"bent-{name}")
    cache = tmp_path / "cache"
    options = _options(proxy, cache)
    dataset = packer.open_dataset(url, **options)
    dataset.reader.prefetch(range(len(manifest["shards"])))  # NPY: every read from the cache
    assert wait_for_downloads(30)
    sample = int(np.flatnonzero(np.load(bent / "records.npy")["file"] == 1)[0])
    with pytest.raises(FormatError, match=f"sample {sample} read from '{url}/{shard}' differs"):
        _every(dataset)
    assert _shard_gets(proxy, f"bent-{name}")[shard] == 2  # the first download, one again
    assert not list(cache.glob("*.part"))
