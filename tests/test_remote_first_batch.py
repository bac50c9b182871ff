"""The first batch through the node-local cache (issues 21, 31): a record of an NPY, HDF5 or LMDB
shard not yet cached is served by a checked ranged GET while the shard downloads in the
background, then read from the cache. Against a real S3 API server (moto) behind the real fault proxy, whose log
shows every request, its Range and the bytes it carried."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fault_proxy import HANG, FaultProxy
from s3_server import S3Server
from torch.utils.data import DataLoader, RandomSampler

import packer
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree
from packer.errors import PackerError
from packer.remote import cached_reader as remote_cached
from packer.remote import storage
from packer.remote.cache import ShardCache, wait_for_downloads

BUCKET = "first"
NAMES = ["images.npy", "images.h5", "images.lmdb"]
RANGED = ["images.npy", "images.lmdb"]  # an LMDB record by range: its recorded byte offset


@pytest.fixture(autouse=True)
def quiet_proxy(monkeypatch: pytest.MonkeyPatch, proxy: FaultProxy) -> Iterator[None]:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=3, base=0.01, cap=0.05))
    proxy.inject([])
    yield
    proxy.inject([])
    proxy.let_held_go()  # a failed test's held answers too
    proxy.delay = 0.0
    assert wait_for_downloads(HANG)  # nothing of this test's left running into the next


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("first_src")
    images = make_image_tree(root / "images", classes=3, per_class=4, size=(64, 48), bad=0)
    out = {}
    for name in NAMES:
        out[name] = root / name
        packer.convert(images.root, out[name], shard_size="6kB", workers=1, progress=False)
        assert len(load_manifest(out[name]).shards) >= 4
    return out


@pytest.fixture(scope="module")
def urls(server: S3Server, local: dict[str, Path]) -> dict[str, str]:
    return {name: server.upload(path, name) for name, path in local.items()}


def _open(url: str, proxy: FaultProxy, cache: Path) -> Any:
    options = {"endpoint_url": proxy.endpoint}
    return packer.open_dataset(url, output="bytes", storage_options=options, cache_dir=cache)


def _whole(shard: Any) -> str:
    """The Range of a shard's whole download."""
    return f"bytes=0-{shard.bytes - 1}"


def _cached(cache: Path) -> set[str]:
    return {e.url.rsplit("/", 1)[1] for e in ShardCache(cache).entries() if not e.partial}


def _shard_traffic(proxy: FaultProxy, name: str) -> list[tuple[str, str | None, int]]:
    """(shard, Range, bytes) of every shard GET the proxy answered for dataset ``name``."""
    prefix = f"GET /{BUCKET}/{name}/shard-"
    return [
        (request.rsplit("/", 1)[1].split("?")[0], ranged, sent)
        for request, ranged, sent in list(proxy.sent)
        if request.startswith(prefix)
    ]


def _still_waiting(read: Any) -> tuple[threading.Thread, list[Any]]:
    """Start ``read()`` in a thread while a download is held; it must still be waiting for the
    download half a second on (a read served by range would have returned: no download can
    end before ``let_held_go``, so a slow machine never fails this; the tests' proof that the
    read waited is their traffic, which shows no range fetched for it). The thread and the
    list its result goes to."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(read()), daemon=True)
    thread.start()
    thread.join(0.5)
    assert thread.is_alive() and got == [], "the read did not wait for its shard's download"
    return thread, got


@pytest.mark.parametrize("name", NAMES)
def test_first_read_is_served_while_its_shard_downloads(
    proxy: FaultProxy, urls: dict[str, str], local: dict[str, Path], tmp_path: Path, name: str
) -> None:
    manifest = load_manifest(local[name])
    shard = manifest.shards[0]
    expected = packer.open_dataset(local[name], output="bytes")
    remote = _open(urls[name], proxy, tmp_path)
    proxy.inject(["held"], match=f"GET /{BUCKET}/{name}/{shard.name} Range={_whole(shard)};")
    assert remote[0] == expected[0]  # sample 0 lies in shard 0: served, the download held
    proxy.wait_until(lambda: proxy.holding == 1)  # the whole shard was asked for: still on its way
    assert _cached(tmp_path) == set() and list(tmp_path.glob("*.part"))
    proxy.let_held_go()
    assert wait_for_downloads(HANG) and _cached(tmp_path) == {shard.name}
    proxy.sent.clear()
    in_shard = np.flatnonzero(remote.shard_of_sample() == 0).tolist()
    assert len(in_shard) >= 2
    assert [remote[i] for i in in_shard] == [expected[i] for i in in_shard]
    # now read from the cache (reads in order may have the next shards on their way)
    assert [t for t in _shard_traffic(proxy, name) if t[0] == shard.name] == []
    remote.close()


@pytest.mark.parametrize("name", RANGED)
def test_a_cold_shuffled_epoch_downloads_each_shard_once(
    proxy: FaultProxy, urls: dict[str, str], local: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """A RandomSampler epoch in batches: every shard downloaded whole once; a record fetched by
    a ranged GET only while its shard was not in the cache, so the epoch's traffic stays under
    1.05x the dataset plus those records; the next epoch reads the cache only."""
    manifest = load_manifest(local[name])
    sizes = {s.name: s.bytes for s in manifest.shards}
    expected = packer.open_dataset(local[name], output="bytes")
    remote = _open(urls[name], proxy, tmp_path)
    shard_of = remote.shard_of_sample()
    proxy.delay = 0.01  # a store a little away: downloads overlap the reads
    proxy.sent.clear()
    order = list(RandomSampler(remote, generator=torch.Generator().manual_seed(5)))
    sampler = RandomSampler(remote, generator=torch.Generator().manual_seed(5))  # the same
    loader = DataLoader(remote, batch_size=4, sampler=sampler, collate_fn=list)
    missing_then = 0  # bytes of the shards each batch touched while they were not cached
    got: list[Any] = []
    cached: set[str] = set()  # before the batch (a shard once cached stays: no limit)
    for k, batch in enumerate(loader):
        touched = {manifest.shards[int(shard_of[i])].name for i in order[4 * k : 4 * k + 4]}
        got += batch
        missing_then += sum(sizes[s] for s in touched - cached)
        cached = _cached(tmp_path)
    assert got == [expected[i] for i in order]
    assert wait_for_downloads(HANG)
    traffic = _shard_traffic(proxy, name)
    downloads = Counter(shard for shard, ranged, _ in traffic if ranged == _whole_of(sizes, shard))
    assert downloads == Counter(dict.fromkeys(sizes, 1))  # each shard once, whole
    twice = sum(n for shard, ranged, n in traffic if ranged != _whole_of(sizes, shard))
    assert 0 < twice <= missing_then  # ranged only for shards not cached at their batch
    assert sum(n for _, _, n in traffic) <= 1.05 * manifest.data_bytes + twice
    proxy.sent.clear()
    assert [remote[i] for i in order] == [expected[i] for i in order]
    assert _shard_traffic(proxy, name) == []  # the second epoch: the cache only
    remote.close()


def _whole_of(sizes: dict[str, int], shard: str) -> str:
    return f"bytes=0-{sizes[shard] - 1}"


@pytest.mark.parametrize("name", RANGED)
def test_a_corrupt_ranged_record_is_never_served(
    proxy: FaultProxy, urls: dict[str, str], local: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """The ranged path of a cached reader checks each record against the record table's
    xxh3: a flipped byte is fetched again; flipped every time, a clear error."""
    shard = load_manifest(local[name]).shards[0]
    expected = packer.open_dataset(local[name], output="bytes")
    remote = _open(urls[name], proxy, tmp_path / "a")
    partial = f"GET /{BUCKET}/{name}/{shard.name} Range=bytes="
    whole = f"{partial}0-{shard.bytes - 1};"
    proxy.inject(["held"], match=whole)  # the download waits: the read goes by range
    assert remote.reader.prefetch([0]) == 1
    proxy.wait_until(lambda: proxy.holding == 1)
    proxy.inject(["flip"], match=partial)
    assert remote[0] == expected[0] and proxy.faults == []
    again = _open(urls[name], proxy, tmp_path / "b")
    proxy.inject(["held"], match=whole)
    assert again.reader.prefetch([0]) == 1  # another cache folder: its own download
    proxy.wait_until(lambda: proxy.holding == 2)
    proxy.inject(["flip"] * 3, match=partial)
    with pytest.raises(PackerError, match=f"{shard.name}.*differs from its checksum"):
        again[0]
    proxy.let_held_go()
    remote.close()
    again.close()


@pytest.mark.parametrize("name", RANGED)
def test_past_its_share_a_read_waits_for_the_download(
    monkeypatch: pytest.MonkeyPatch,
    proxy: FaultProxy,
    urls: dict[str, str],
    local: dict[str, Path],
    tmp_path: Path,
    name: str,
) -> None:
    """A process serves at most its share of a downloading shard by range (here: the first
    record only); the next read of that shard waits for the download, then reads the cache."""
    shard = load_manifest(local[name]).shards[0]
    expected = packer.open_dataset(local[name], output="bytes")
    remote = _open(urls[name], proxy, tmp_path)
    in_shard = np.flatnonzero(remote.shard_of_sample() == 0).tolist()
    first = len(expected[in_shard[0]][0])
    monkeypatch.setattr(remote_cached, "RANGED_SHARE", 0.0)
    monkeypatch.setattr(remote_cached, "RANGED_FLOOR", first)
    proxy.inject(["held"], match=f"GET /{BUCKET}/{name}/{shard.name} Range={_whole(shard)};")
    proxy.sent.clear()
    assert remote[in_shard[0]] == expected[in_shard[0]]  # within its share: by range, held
    proxy.wait_until(lambda: proxy.holding == 1)
    thread, got = _still_waiting(lambda: remote[in_shard[1]])  # past it: waits for the download
    proxy.let_held_go()
    thread.join(HANG)
    assert got == [expected[in_shard[1]]]
    assert shard.name in _cached(tmp_path)  # (two reads in order: the next two on their way)
    traffic = _shard_traffic(proxy, name)
    ranged = [n for s, r, n in traffic if s == shard.name and r != _whole(shard)]
    assert ranged == [first]  # the bytes fetched twice: that one record
    remote.close()


def test_an_lmdb_record_of_unknown_offset_waits_for_its_shard(
    monkeypatch: pytest.MonkeyPatch, server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    """An LMDB converted where value offsets could not be told (no ``/proc``: -1 in the record
    table) has no byte range to fetch: its reads wait for the shard's download, never a guess."""
    from packer.formats import lmdb as lmdb_format

    def unknown(path: Path, count: int, chunk: int = 0) -> np.ndarray:  # noqa: ARG001
        return np.full(count, -1, np.int64)

    monkeypatch.setattr(lmdb_format, "value_offsets", unknown)
    tree = make_image_tree(tmp_path / "src", classes=2, per_class=3, size=(64, 48), bad=0)
    out = tmp_path / "unknown.lmdb"
    packer.convert(tree.root, out, shard_size="6kB", workers=1, progress=False)
    assert (np.load(out / "records.npy")["offset"] == -1).all()
    url = server.upload(out, "unknown.lmdb")
    shard = load_manifest(out).shards[0]
    remote = _open(url, proxy, tmp_path / "cache")
    proxy.inject(["held"], match=f"GET /{BUCKET}/unknown.lmdb/{shard.name} Range={_whole(shard)};")
    proxy.sent.clear()
    thread, got = _still_waiting(lambda: remote[0])  # waits for the download
    proxy.let_held_go()
    thread.join(HANG)
    assert got == [packer.open_dataset(out, output="bytes")[0]]
    assert [r for _, r, _ in _shard_traffic(proxy, "unknown.lmdb")] == [_whole(shard)]
    remote.close()


@pytest.mark.parametrize("name", RANGED)
def test_read_into_mixes_cached_and_ranged_records(
    proxy: FaultProxy, urls: dict[str, str], local: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """``read_into`` (the path of decoders that fill one buffer) over shard 1, cached, and
    shard 0, whose download is slow (its records come by range): every record in its place."""
    shard = load_manifest(local[name]).shards[0]
    remote = _open(urls[name], proxy, tmp_path)
    reader = remote.reader
    reader.cached(1).close()  # shard 1 in the cache
    proxy.inject(["held"], match=f"GET /{BUCKET}/{name}/{shard.name} Range={_whole(shard)};")
    records = np.flatnonzero(np.isin(reader.file, [1, 0]))[::-1]
    lengths = reader.length[records]
    where = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    out = bytearray(int(lengths.sum()))
    reader.read_into(records, memoryview(out), where)  # shard 0's records did not wait for it:
    proxy.wait_until(lambda: proxy.holding == 1)  # its download is held still
    proxy.let_held_go()
    expected = packer.open_dataset(local[name], output="bytes").reader.read_many(records)
    got = [bytes(out[w : w + n]) for w, n in zip(where.tolist(), lengths.tolist())]
    assert got == expected
    remote.close()
