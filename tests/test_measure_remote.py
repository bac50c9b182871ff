"""``packer doctor URL`` and ``packer bench URL`` (issue 21, item 7): the store measured through a
real S3 API server on the loopback with a latency injected by a real proxy; the figures follow the
injected latency and the recommendations follow the figures; bench reads every sample of a URL."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fault_proxy import FaultProxy, fault_proxy
from s3_server import S3Server

import packer
from packer.cli.app import main
from packer.core.cpus import available_cpus
from packer.demo.image import make_image_tree
from packer.diagnosis.doctor_remote import doctor_remote
from packer.errors import PackerError
from packer.remote.cache import wait_for_downloads

DELAY = 0.05  # seconds the proxy holds every request
BUCKET = "data"  # the module's bucket on the shared S3 server (conftest)


@pytest.fixture(scope="module")
def url(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("doctor_remote")
    tree = make_image_tree(root / "images", classes=2, per_class=6, size=(64, 48), bad=0)
    packer.convert(tree.root, root / "out.npy", shard_size="20kB", workers=1, progress=False)
    return server.upload(root / "out.npy", "doctor.npy")


@pytest.fixture()
def proxy(server: S3Server) -> Iterator[FaultProxy]:
    with fault_proxy(server.endpoint) as running:
        yield running


def test_latency_follows_the_store_and_advice_follows_latency(url: str, proxy: FaultProxy) -> None:
    options = {"endpoint_url": proxy.endpoint}
    near = doctor_remote(url, options, step_ms=10, batch_size=4, probes=4)
    proxy.delay = DELAY
    far = doctor_remote(url, options, step_ms=10, batch_size=4, probes=4)
    # every probe through the delaying proxy waited for it (a floor the proxy's hold sets, not
    # a bound on how fast the machine is); near: the same probes, none held
    assert len(far.latency_ms) == len(near.latency_ms) == 4
    assert min(far.latency_ms) >= 1e3 * DELAY and far.latency_median_ms >= 1e3 * DELAY
    assert far.shuffled_ms >= 1e3 * DELAY
    assert len(far.latency_ms) == 4 and far.stream_mb_s > 0 and far.streams_mb_s > 0
    # a batch waits >= 50 ms at a 10 ms step: >= 5 batches in flight (at most 4 per CPU)
    assert far.workers == min(4 * available_cpus(), math.ceil(far.shuffled_ms / 10))
    assert far.workers >= 5
    # a 16 kB shard of ~6 samples is read in 6 x 10/4 ms = 15 ms, fetched in >= 50 ms
    assert far.prefetch >= 1 + math.ceil(1e3 * DELAY / 15) and near.prefetch >= 2
    assert far.samples == 12 and far.format == "npy" and far.dataset_bytes > 0
    assert far.cache_limit == far.dataset_bytes  # 12 small images fit any cache folder
    text = str(far)
    assert "latency" in text and f"num_workers={far.workers}" in text
    assert f"prefetch={far.prefetch}" in text


def test_cli_doctor_on_a_url(url: str, server: S3Server, tmp_path: Path) -> None:
    runner = CliRunner()
    option = f"endpoint_url={server.endpoint}"
    out = runner.invoke(main, ["doctor", url, "--storage-option", option, "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["url"] == url and report["samples"] == 12
    assert report["latency_median_ms"] > 0 and report["recommendations"]
    local = runner.invoke(main, ["doctor", str(tmp_path), "--storage-option", option])
    assert local.exit_code == 2 and "is for a URL dataset" in local.output
    missing = runner.invoke(main, ["doctor", url + "-gone", "--storage-option", option])
    assert missing.exit_code == 1 and "doctor.npy-gone" in missing.output


def test_bad_arguments_are_packer_errors(url: str, server: S3Server) -> None:
    with pytest.raises(PackerError, match="batch_size"):
        doctor_remote(url, server.options, batch_size=0)


def test_bench_reads_a_url_beside_its_local_copy(
    url: str, server: S3Server, tmp_path: Path
) -> None:
    local = tmp_path / "local.npy"
    server.filesystem().get(url, str(local), recursive=True)
    runner = CliRunner()
    option = f"endpoint_url={server.endpoint}"
    args = ["bench", str(local), url, "--workers", "0,2", "--storage-option", option, "--json"]
    out = runner.invoke(main, args)
    assert out.exit_code == 0, out.output
    runs = json.loads(out.stdout)["runs"]  # progress lines go to stderr
    assert [(r["path"], r["workers"]) for r in runs] == [
        (str(local), 0), (url, 0), (str(local), 2), (url, 2),
    ]  # fmt: skip
    assert all(r["images"] == 12 and r["bytes"] > 0 for r in runs)
    assert runs[1]["bytes"] == runs[0]["bytes"] and runs[1]["ratio"] > 0
    refused = runner.invoke(main, ["bench", str(local), "--storage-option", option])
    assert refused.exit_code == 2 and "is for a URL dataset" in refused.output


def test_doctor_reports_what_the_node_local_cache_holds(
    url: str, server: S3Server, tmp_path: Path
) -> None:
    runner = CliRunner()
    args = ["doctor", url, "--storage-option", f"endpoint_url={server.endpoint}", "--json"]
    args += ["--cache-dir", str(tmp_path)]
    empty = json.loads(runner.invoke(main, args).stdout)
    assert empty["files"] >= 2 and empty["cached_files"] == 0 == empty["cached_bytes"]
    ds = packer.open_dataset(url, storage_options=server.options, cache_dir=tmp_path)
    for i in range(len(ds)):  # one epoch through the cache
        ds[i]
    assert wait_for_downloads(30)  # the shards whose records came by range meanwhile
    ds.close()
    full = json.loads(runner.invoke(main, args).stdout)
    assert full["cached_files"] == full["files"] == empty["files"]
    assert full["cached_bytes"] == sum(s.bytes for s in ds.manifest.shards)
    assert any("100 % of shard reads" in f for f in full["findings"])
