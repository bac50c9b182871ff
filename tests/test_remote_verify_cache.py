"""``packer verify URL --cache-dir`` (issue 21): the shards are checked by downloading them into
the node-local cache, so a verified dataset is warm (the next epoch makes no shard GET), and a
corrupt shard is reported, never cached. Real S3 API server (moto) behind the real fault proxy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fault_proxy import FaultProxy
from s3_server import S3Server

import packer
from packer.cli.app import main
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree
from packer.errors import PackerError
from packer.read.verify import verify
from packer.remote import storage
from packer.remote.cache import ShardCache, wait_for_downloads

BUCKET = "verified"


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01, cap=0.02))
    yield


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("verified")
    tree = make_image_tree(root / "images", classes=3, per_class=3, size=(48, 32), bad=0)
    packer.convert(tree.root, root / "out.npy", shard_size="6kB", workers=1, progress=False)
    assert len(load_manifest(root / "out.npy").shards) >= 3
    return root / "out.npy"


def _shard_gets(proxy: FaultProxy, name: str) -> list[str]:
    return [line for line in proxy.served if line.startswith(f"GET /{BUCKET}/{name}/shard-")]


def test_a_verified_dataset_is_warm(
    server: S3Server, proxy: FaultProxy, local: Path, tmp_path: Path
) -> None:
    url = server.upload(local, "warm.npy")
    cache = tmp_path / "cache"
    proxy.served.clear()
    args = ["verify", url, "--storage-option", f"endpoint_url={proxy.endpoint}", "--json"]
    result = CliRunner().invoke(main, [*args, "--cache-dir", str(cache)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] and report["samples_checked"] == 9
    shards = load_manifest(local).shards
    assert len(_shard_gets(proxy, "warm.npy")) == len(shards)  # one download each, no stream
    proxy.served.clear()
    options = {"endpoint_url": proxy.endpoint}
    remote = packer.open_dataset(url, output="bytes", storage_options=options, cache_dir=cache)
    expected = packer.open_dataset(local, output="bytes")
    assert [remote[i] for i in range(len(remote))] == [expected[i] for i in range(9)]
    assert _shard_gets(proxy, "warm.npy") == []  # the epoch after verify: zero data GETs
    remote.close()


def test_a_corrupt_shard_is_reported_and_never_cached(
    server: S3Server, proxy: FaultProxy, local: Path, tmp_path: Path
) -> None:
    url = server.upload(local, "corrupt.npy")
    shard = load_manifest(local).shards[1]
    data = bytearray((local / shard.name).read_bytes())
    data[len(data) // 2] ^= 0x01  # the same size: only the checksum tells
    server.filesystem().pipe_file(f"{url}/{shard.name}", bytes(data))
    options = {"endpoint_url": proxy.endpoint}
    report = verify(url, progress=False, storage_options=options, cache_dir=tmp_path)
    assert [p.where for p in report.problems] == [shard.name, shard.name]
    assert "checksum differs" in report.problems[0].what
    assert f"its {shard.samples} sample(s) were not read" in report.problems[1].what
    assert report.samples_checked == 9 - shard.samples
    assert wait_for_downloads(30)  # shards read ahead of the check in order, too
    cached = {e.url.rsplit("/", 1)[1] for e in ShardCache(tmp_path).entries()}
    assert cached == {s.name for s in load_manifest(local).shards} - {shard.name}
    with pytest.raises(PackerError, match="the shard cache is for a URL"):
        verify(local, progress=False, cache_dir=tmp_path)
