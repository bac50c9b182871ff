"""Prefetch in the order of reading (issue 21, item 4): shards of a remote dataset fetched into
the node-local cache on background threads ahead of their read, against a real S3 API server
(moto) behind the real fault proxy; the proxy's log shows what was fetched and when."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fault_proxy import HANG, FaultProxy
from s3_server import S3Server

import packer
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree
from packer.diagnosis.io_counters import resident_fraction
from packer.diagnosis.targets import evict_page_cache
from packer.remote.cache import ShardCache, wait_for_downloads

BUCKET = "prefetch"


@pytest.fixture(scope="module")
def url(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("prefetch")
    tree = make_image_tree(root / "images", classes=3, per_class=4, size=(64, 48), bad=0)
    packer.convert(tree.root, root / "out.lmdb", shard_size="6kB", workers=1, progress=False)
    assert len(load_manifest(root / "out.lmdb").shards) >= 4
    return server.upload(root / "out.lmdb", "out.lmdb")


def shard_gets(proxy: FaultProxy) -> Counter[str]:
    prefix = f"GET /{BUCKET}/out.lmdb/shard-"
    return Counter(
        line.split(" ", 2)[1].rsplit("/", 1)[1].split("?")[0]
        for line in proxy.served
        if line.startswith(prefix)
    )


def cached(cache_dir: Path) -> set[str]:
    """The shard names whose download finished in the cache."""
    return {e.url.rsplit("/", 1)[1] for e in ShardCache(cache_dir).entries() if not e.partial}


def wait_for(test: Any) -> None:
    """Poll ``test`` (the kernel's page cache, which tells no event) until true; a test still
    false after :data:`HANG` s fails (a hang guard, no bound on a slow machine)."""
    deadline = time.monotonic() + HANG
    while not test():
        assert time.monotonic() < deadline, f"still not so after {HANG:.0f} s"
        time.sleep(0.02)


def test_dataset_prefetch_fetches_the_shards_of_given_samples(
    url: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    ds = packer.open_dataset(
        url, output="bytes", storage_options={"endpoint_url": proxy.endpoint}, cache_dir=tmp_path
    )
    shards = ds.shard_of_sample()
    names = ds.reader.shard_names
    assert ds.prefetches
    wanted = np.flatnonzero(shards == shards[-1])[:2]  # two samples of the last shard
    assert ds.prefetch(wanted) == 1  # one shard, one download started
    assert wait_for_downloads(HANG)  # it ended (an event: the download's own)
    assert cached(tmp_path) == {names[shards[-1]]}
    assert shard_gets(proxy)[names[shards[-1]]] >= 1
    assert ds.prefetch(wanted) == 0  # cached: nothing to start
    proxy.served.clear()
    local = [ds[int(i)] for i in wanted]
    assert shard_gets(proxy) == Counter()  # the reads found the shard cached: no shard GET
    assert all(
        isinstance(data, bytes) and label == ds.targets[i]
        for (data, label), i in zip(local, wanted)
    )
    ds.close()


@pytest.mark.usefixtures("whole_shards")  # each shard's one whole download is counted
def test_sampler_fetches_the_next_blocks_while_one_is_read(
    url: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    """ShardedSampler(prefetch=2): before the first sample is read, the shards of the first
    three blocks are being fetched, and no other; entering each next block starts the one two
    blocks further. A whole epoch then reads every sample with each shard fetched once."""
    options = {"endpoint_url": proxy.endpoint}
    ds = packer.open_dataset(url, output="bytes", storage_options=options, cache_dir=tmp_path)
    names, shards = ds.reader.shard_names, ds.shard_of_sample()
    order = list(packer.ShardedSampler(ds, seed=3, prefetch=0))  # the same order, no fetch
    assert cached(tmp_path) == set()
    sampler = packer.ShardedSampler(ds, seed=3, prefetch=2)
    blocks = list(dict.fromkeys(int(shards[i]) for i in order))  # blocks in reading order
    assert len(blocks) >= 4
    proxy.served.clear()
    it = iter(sampler)
    first = next(it)
    assert first == order[0]
    # the downloads it started before yielding it ended, and they were these and no other
    assert wait_for_downloads(HANG)
    assert cached(tmp_path) == {names[b] for b in blocks[:3]}
    got = [first]
    for i in it:  # into the second block: the fourth is fetched
        got.append(i)
        if shards[i] == blocks[1]:
            break
    assert wait_for_downloads(HANG)
    assert cached(tmp_path) == {names[b] for b in blocks[:4]}
    got += list(it)
    assert got == order
    data = [ds[i][0] for i in got]
    assert len(data) == len(ds) and all(isinstance(d, bytes) for d in data)
    assert shard_gets_per_shard(proxy) == {names[b]: 1 for b in blocks}
    ds.close()


def shard_gets_per_shard(proxy: FaultProxy) -> dict[str, int]:
    """Downloads per shard: a shard is fetched by ranged GETs of one download (8 MiB each, so
    one GET for these small shards)."""
    return dict(shard_gets(proxy))


@pytest.mark.parametrize("suffix", [".lmdb", ".npy"])
def test_a_local_dataset_has_the_blocks_ahead_read_into_the_page_cache(
    tmp_path: Path, suffix: str
) -> None:
    """Locally, ShardedSampler(prefetch=2) asks the kernel for the next blocks' shard files
    (POSIX_FADV_WILLNEED): evicted from the page cache, the first three blocks' shards are back
    in it after the first index, the others not yet. An exact reader (a caption-only pass) asks
    for nothing: it reads a small share of each shard."""
    tree = make_image_tree(tmp_path / "images", classes=2, per_class=12, size=(64, 48), bad=0)
    out = tmp_path / f"out{suffix}"
    packer.convert(tree.root, out, shard_size="12kB", workers=1, progress=False)
    ds = packer.open_dataset(out, output="bytes")
    names, shards = ds.reader.shard_names, ds.shard_of_sample()
    paths = [out / name for name in names]
    assert len(paths) >= 6 and ds.prefetches
    order = list(packer.ShardedSampler(ds, seed=2, prefetch=0))
    blocks = list(dict.fromkeys(int(shards[i]) for i in order))
    assert evict_page_cache(paths) == len(paths)
    assert resident_fraction(paths) == 0.0  # as tests/test_bench.py relies on too
    first = next(iter(packer.ShardedSampler(ds, seed=2, prefetch=2)))
    assert first == order[0]
    ahead = [paths[b] for b in blocks[:3]]
    wait_for(lambda: resident_fraction(ahead) == 1.0)
    assert resident_fraction([paths[b] for b in blocks[3:]]) == 0.0
    assert ds.prefetch(np.flatnonzero(shards == blocks[-1])) == 1  # the dataset's own call
    wait_for(lambda: resident_fraction([paths[blocks[-1]]]) == 1.0)
    ds.reader.read_exactly()
    assert not ds.prefetches and ds.prefetch(range(len(ds))) == 0
    assert sorted(packer.ShardedSampler(ds, prefetch=3)) == list(range(len(ds)))


@pytest.fixture(scope="module")
def both(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An LMDB and an NPY output of 8 shards of 2 images each, at URLs."""
    root = tmp_path_factory.mktemp("in_order")
    tree = make_image_tree(root / "images", classes=2, per_class=8, size=(64, 48), bad=0)
    urls = {}
    for suffix in (".lmdb", ".npy"):
        out = root / f"order{suffix}"
        packer.convert(tree.root, out, shard_size="6kB", workers=1, progress=False)
        assert len(load_manifest(out).shards) >= 6
        urls[suffix] = server.upload(out, f"order{suffix}")
    return urls


@pytest.mark.parametrize("suffix", [".lmdb", ".npy"])
def test_a_reader_in_order_has_the_next_shards_fetched(
    both: dict[str, str], proxy: FaultProxy, tmp_path: Path, suffix: str
) -> None:
    """Reads in order (a SequentialSampler: no sampler tells the order) start the downloads of
    the next two shards; reads that jump between shards start none beyond their own; under a
    cache limit the dataset does not fit in, none is read ahead (it would evict)."""
    options = {"endpoint_url": proxy.endpoint}
    ds = packer.open_dataset(
        both[suffix], output="bytes", storage_options=options, cache_dir=tmp_path / "a"
    )
    names, shards = ds.reader.shard_names, ds.shard_of_sample()
    for i in np.flatnonzero(shards == 0)[:2].tolist():  # two requests in shard 0
        ds[i]
    assert wait_for_downloads(HANG)
    assert cached(tmp_path / "a") == {names[0], names[1], names[2]}
    ds.close()
    jumps = packer.open_dataset(
        both[suffix], output="bytes", storage_options=options, cache_dir=tmp_path / "b"
    )
    for shard in (4, 1, 3):  # a shuffled reader
        jumps[int(np.flatnonzero(shards == shard)[0])]
    assert wait_for_downloads(HANG)
    assert cached(tmp_path / "b") == {names[4], names[1], names[3]}
    jumps.close()
    largest = max(s.bytes for s in ds.manifest.shards)
    limited = packer.open_dataset(
        both[suffix],
        output="bytes",
        storage_options=options,
        cache_dir=tmp_path / "c",
        cache_limit=4 * largest,  # under the dataset's size: read-ahead would evict
    )
    for i in np.flatnonzero(shards == 0)[:2].tolist():
        limited[i]
    assert wait_for_downloads(HANG)
    assert cached(tmp_path / "c") == {names[0]}  # no shard ahead
    limited.close()
