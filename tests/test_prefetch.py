"""Prefetch in the order of reading (issue 21, item 4): shards of a remote dataset fetched into
the node-local cache on background threads ahead of their read, against a real S3 API server
(moto) behind the real fault proxy; the proxy's log shows what was fetched and when."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fault_proxy import FaultProxy, fault_proxy
from s3_server import S3Server, s3_server

import packer
from packer.cache import ShardCache
from packer.manifest import load_manifest
from packer.tools.image_demo import make_image_tree

BUCKET = "prefetch"


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with s3_server(BUCKET) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(server: S3Server) -> Iterator[FaultProxy]:
    with fault_proxy(server.endpoint) as running:
        yield running


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


def wait_for(test: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not test():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_dataset_prefetch_fetches_the_shards_of_given_samples(
    url: str, proxy: FaultProxy, tmp_path: Path
) -> None:
    ds = packer.open_dataset(
        url, output="bytes", storage_options={"endpoint_url": proxy.endpoint}, cache_dir=tmp_path
    )
    shards = ds.shard_of_sample()
    names = ds.reader.shard_names
    wanted = np.flatnonzero(shards == shards[-1])[:2]  # two samples of the last shard
    assert ds.prefetch(wanted) == 1  # one shard, one download started
    wait_for(lambda: cached(tmp_path) == {names[shards[-1]]})
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
