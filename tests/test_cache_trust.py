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
from click.testing import CliRunner
from fault_proxy import FaultProxy
from s3_server import S3Server
from torch.utils.data import DataLoader

import packer
from packer.cli.app import main
from packer.core.file_locks import UnsafeCacheFile
from packer.core.manifest import MANIFEST_NAME, file_checksum, load_manifest
from packer.demo.image import make_image_tree
from packer.errors import FormatError
from packer.remote import storage
from packer.remote.cache import wait_for_downloads

BUCKET = "trust"
# these tests attack the cache's whole-shard downloads: no first batch by ranged GETs
pytestmark = pytest.mark.usefixtures("whole_shards")
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


@pytest.fixture
def dropped(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> dict[str, Any]:
    """An LMDB dataset at a URL, warm in a cache, then shard 1's ``K.data`` and ``K.json``
    removed (its next read downloads it); a victim file outside the cache to aim links at."""
    name = "images.lmdb"
    url = _upload(server, local[name], f"planted-{tmp_path.name}")
    cache = tmp_path / "cache"
    options = {**_options(proxy, cache), "cache_limit": "1GB"}  # eviction's lock is used too
    _warm(url, options)
    shard = load_manifest(local[name]).shards[1].name
    key = _keys(cache)[shard]
    victim = tmp_path / "victim"
    victim.write_bytes(b"not the cache's")
    return {
        "url": url,
        "options": options,
        "cache": cache,
        "key": key,
        "shard": shard,
        "victim": victim,
        "local": local[name],
        "expected": _every(packer.open_dataset(local[name], output="bytes")),
        "gets": lambda: _shard_gets(proxy, url.rsplit("/", 1)[1])[shard],
    }


def _untouched(victim: Path, before: os.stat_result) -> None:
    after = victim.stat()
    assert victim.read_bytes() == b"not the cache's"
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (
        before.st_ino,
        before.st_size,
        before.st_mtime_ns,
    )


PLANTS = {
    "part link": (".part", "link", "a symbolic link"),
    "part dangling link": (".part", "dangling", "a symbolic link"),
    "part hard link": (".part", "hard link", "a file with 2 links"),
    "lock link": (".lock", "link", "a symbolic link"),
    "lock dangling link": (".lock", "dangling", "a symbolic link"),
    "lock of another user": (".lock", "foreign", "owned by another user \\(uid 65534\\)"),
    "part of another user": (".part", "foreign", "owned by another user \\(uid 65534\\)"),
    "eviction lock link": ("/.evict.lock", "link", "a symbolic link"),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_a_planted_lock_or_part_is_refused_never_written_through(
    dropped: dict[str, Any], tmp_path: Path, plant: str
) -> None:
    suffix, kind, why = PLANTS[plant]
    cache, victim = dropped["cache"], dropped["victim"]
    path = cache / ".evict.lock" if suffix.startswith("/") else cache / (dropped["key"] + suffix)
    unlink = path.unlink if path.exists() else None
    if unlink:
        unlink()
    (cache / (dropped["key"] + ".data")).unlink()
    (cache / (dropped["key"] + ".json")).unlink()
    nowhere = tmp_path / "never-created"
    if kind == "link":
        path.symlink_to(victim)
    elif kind == "dangling":
        path.symlink_to(nowhere)
    elif kind == "hard link":
        os.link(victim, path)
    else:
        path.write_bytes(b"")
        os.chown(path, 65534, 65534)
    before = victim.stat()
    dataset = packer.open_dataset(dropped["url"], **dropped["options"])
    with pytest.raises(
        UnsafeCacheFile, match=f"refusing the shard cache's file '{path}': it is {why}"
    ):
        _every(dataset)
    dataset.close()
    _untouched(victim, before)
    assert not nowhere.exists()  # a dangling link's target is never created
    cleared = CliRunner().invoke(main, ["cache", "clear", "--cache-dir", str(cache)])
    assert cleared.exit_code == 0, cleared.output
    assert not path.is_symlink() and (not path.exists() or path.stat().st_uid == os.geteuid())
    _untouched(victim, before)
    assert _every(packer.open_dataset(dropped["url"], **dropped["options"])) == dropped["expected"]
    _healthy(cache, dropped["local"])


def test_a_planted_json_link_is_replaced_never_written_through(dropped: dict[str, Any]) -> None:
    cache, victim = dropped["cache"], dropped["victim"]
    (cache / (dropped["key"] + ".data")).unlink()
    meta = cache / (dropped["key"] + ".json")
    meta.unlink()
    meta.symlink_to(victim)
    before = victim.stat()
    assert _every(packer.open_dataset(dropped["url"], **dropped["options"])) == dropped["expected"]
    _untouched(victim, before)
    assert not meta.is_symlink() and json.loads(meta.read_text())["url"].endswith(dropped["shard"])
    _healthy(cache, dropped["local"])


@pytest.mark.parametrize("kind", ["link", "another user's"])
def test_a_linked_or_foreign_data_file_is_never_read(dropped: dict[str, Any], kind: str) -> None:
    """A ``K.data`` that is a link (even to the right bytes) or another user's file is not
    used: downloaded again and renamed over; a link's target is untouched."""
    cache = dropped["cache"]
    data = cache / (dropped["key"] + ".data")
    right = (dropped["local"] / dropped["shard"]).read_bytes()
    target = dropped["victim"]
    if kind == "link":
        target.write_bytes(right)  # LMDB would serve it happily: it must not be asked to
        data.unlink()
        data.symlink_to(target)
    else:
        os.chown(data, 65534, 65534)
    before, gets = target.stat(), dropped["gets"]()
    assert _every(packer.open_dataset(dropped["url"], **dropped["options"])) == dropped["expected"]
    assert dropped["gets"]() == gets + 1  # downloaded again, not read through the plant
    if kind == "link":
        assert target.read_bytes() == right and target.stat().st_mtime_ns == before.st_mtime_ns
    _healthy(cache, dropped["local"])


def test_verify_through_the_cache_replaces_a_damaged_copy(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    """``packer verify URL --cache-dir``: a shard cached before is hashed whole, not taken on
    its size; a flipped byte there is downloaded again (the dataset is fine: verify passes)."""
    url = _upload(server, local["images.npy"], "verified.npy")
    cache = tmp_path / "cache"
    args = ["verify", url, "--storage-option", f"endpoint_url={proxy.endpoint}"]
    args += ["--cache-dir", str(cache), "--json"]
    assert CliRunner().invoke(main, args).exit_code == 0
    shard = load_manifest(local["images.npy"]).shards[1].name
    _flip(cache / (_keys(cache)[shard] + ".data"), 100)
    before = _shard_gets(proxy, "verified.npy")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"]
    assert _shard_gets(proxy, "verified.npy") - before == Counter({shard: 1})
    _healthy(cache, local["images.npy"])
