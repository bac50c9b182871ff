"""The obstore read backend (issue 21, item 1; ``packer.remote.obstore_backend``) against the real S3 API
server (moto) behind the fault-injecting proxy: every format read back through DataLoader workers
under fork and spawn equals the local dataset; 503, 429, dropped and cut bodies are retried by
packer's one retry layer (obstore's own retries off), a corrupt body is never served, 403/404
are immediate clear errors and a replaced object is refused; a forked child of a process that
used obstore reads through fsspec instead of hanging in obstore's inherited runtime."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from fault_proxy import FaultProxy
from obstore.exceptions import GenericError
from s3_server import S3Server
from torch.utils.data import ConcatDataset, DataLoader, Dataset

import packer
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree
from packer.errors import FormatError, PackerError
from packer.remote import obstore_backend as store_obstore
from packer.remote import storage
from packer.remote.storage import RemoteFolder, passing, remote_error

BUCKET = "obstore"
NAMES = ("images.npy", "images.h5", "images.bmp", "images.lmdb")


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch, proxy: FaultProxy) -> None:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=4, base=0.01, cap=0.05))
    proxy.inject([])


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("obstore_src")
    tree = make_image_tree(root / "images", classes=2, per_class=4, size=(64, 48), bad=0)
    out = {}
    for name in NAMES:
        out[name] = root / name
        packer.convert(tree.root, out[name], shard_size="8kB", workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def urls(server: S3Server, local: dict[str, Path]) -> dict[str, str]:
    return {name: server.upload(path, name) for name, path in local.items()}


def _obstore(proxy: FaultProxy, **more: Any) -> dict[str, Any]:
    return {"endpoint_url": proxy.endpoint, "backend": "obstore", **more}


def _every(dataset: Any) -> list[bytes]:
    return [dataset[i][0] for i in range(len(dataset))]


class Tagged(Dataset):
    """A dataset's samples, each with whether this process's reads went through obstore."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> tuple[bytes, tuple[int, bool]]:
        data = self.inner[i][0]
        return data, (os.getpid(), store_obstore._RUNTIME_PID == os.getpid())


def _as_list(batch: list) -> list:
    return batch


def test_every_format_through_spawned_and_forked_workers(
    proxy: FaultProxy, local: dict[str, Path], urls: dict[str, str], tmp_path: Path
) -> None:
    """One loader over all four formats (a fresh process starts its workers once): bytes equal
    to the local datasets, every request of the forkserver's workers through obstore."""
    remote = [
        packer.open_dataset(
            urls[n], output="bytes", storage_options=_obstore(proxy), cache_dir=tmp_path / n
        )
        for n in NAMES
    ]
    expected = [b for n in NAMES for b in _every(packer.open_dataset(local[n], output="bytes"))]
    for context in ("forkserver", "fork"):
        loader = DataLoader(
            Tagged(ConcatDataset(remote)),
            batch_size=4,
            num_workers=2,
            multiprocessing_context=context,
            collate_fn=_as_list,
            timeout=60,
        )
        got = [item for batch in loader for item in batch]
        assert [data for data, _ in got] == expected
        if context == "forkserver":  # each worker's requests went through obstore; a sample
            # found in the cache another worker filled needs none (before the worker's first)
            tags = [tag for _, tag in got]
            for pid in {pid for pid, _ in tags}:
                mine = [through for p, through in tags if p == pid]
                assert any(mine) and all(mine[mine.index(True) :])


FORKED = """
import hashlib, json, os, sys
from torch.utils.data import DataLoader
import packer
from packer.remote import obstore_backend as store_obstore

url, endpoint = sys.argv[1:3]
ds = packer.open_dataset(url, output="bytes",
                         storage_options={"endpoint_url": endpoint, "backend": "obstore"})

def epoch():
    loader = DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork",
                        timeout=30, collate_fn=lambda b: [
                            (hashlib.sha1(x).hexdigest(), store_obstore._RUNTIME_PID == os.getpid())
                            for x, _ in b])
    return [item for batch in loader for item in batch]

first = epoch()  # the parent opened only (metadata through fsspec): the workers use obstore
ran_before = store_obstore._RUNTIME_PID
ds[0]  # the parent reads through obstore: its forked workers must not call obstore again
second = epoch()
print(json.dumps({"first": first, "second": second, "parent_before": ran_before,
                  "parent_after": store_obstore._RUNTIME_PID == os.getpid()}))
"""


def test_forked_workers_of_a_process_that_used_obstore_read_through_fsspec(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], urls: dict[str, str]
) -> None:
    """In a fresh process (this one's obstore runtime may be started): open, fork → obstore in
    the workers; read in the parent, fork again → the workers read through fsspec, the same
    bytes, and nothing hangs in obstore's inherited runtime (DataLoader's timeout)."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(FORKED), urls["images.npy"], proxy.endpoint],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(packer.__file__).parents[1])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    expected = [hashlib.sha1(b).hexdigest() for b in _every(_local(local, "images.npy"))]
    assert [h for h, _ in found["first"]] == expected == [h for h, _ in found["second"]]
    assert found["parent_before"] is None and found["parent_after"]
    assert all(through for _, through in found["first"])
    assert not any(through for _, through in found["second"])


def _local(local: dict[str, Path], name: str) -> Any:
    return packer.open_dataset(local[name], output="bytes")


def _shard(local: dict[str, Path], name: str) -> str:
    return load_manifest(local[name]).shards[0].name


@pytest.mark.parametrize("faults", [["503", "429", "503"], ["drop", "drop"], ["short", "503"]])
def test_passing_faults_are_retried(
    proxy: FaultProxy, local: dict[str, Path], urls: dict[str, str], faults: list[str]
) -> None:
    remote = packer.open_dataset(urls["images.h5"], output="bytes", storage_options=_obstore(proxy))
    proxy.inject(faults, match=f"GET /{BUCKET}/images.h5/{_shard(local, 'images.h5')}")
    assert remote.reader.read_many(range(len(remote))) == _every(_local(local, "images.h5"))
    assert proxy.faults == []
    assert isinstance(remote.reader.remote.ranges(), store_obstore.ObstoreRanges)


@pytest.mark.parametrize("fault", ["whole", "badrange", "longer"])
def test_a_bad_answer_to_a_range_is_retried(
    proxy: FaultProxy, local: dict[str, Path], urls: dict[str, str], fault: str
) -> None:
    """Issue 28, item 7: a 200 with the whole object, a Content-Range naming another start or
    a 206 longer than asked is a passing fault, retried as fsspec's reads are."""
    remote = packer.open_dataset(urls["images.h5"], output="bytes", storage_options=_obstore(proxy))
    proxy.inject([fault, fault], match=f"GET /{BUCKET}/images.h5/{_shard(local, 'images.h5')}")
    assert remote.reader.read_many(range(len(remote))) == _every(_local(local, "images.h5"))
    assert proxy.faults == []
    assert isinstance(remote.reader.remote.ranges(), store_obstore.ObstoreRanges)


def test_endless_503_ends_in_packers_bounded_error(
    proxy: FaultProxy, local: dict[str, Path], urls: dict[str, str]
) -> None:
    """obstore's own retries are off: 4 requests in all (packer's RETRY), then the error."""
    remote = packer.open_dataset(urls["images.h5"], output="bytes", storage_options=_obstore(proxy))
    shard = _shard(local, "images.h5")
    proxy.inject(["503"] * 10, match=f"GET /{BUCKET}/images.h5/{shard}")
    with pytest.raises(PackerError, match=rf"{shard}'.*4 attempts over .*s all failed.*503"):
        remote.reader.read_many([0])
    assert len(proxy.faults) == 6  # 4 tries (a count: no bound on how long the machine took)


def test_denied_and_missing_objects_are_clear_at_once(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path]
) -> None:
    url = server.upload(local["images.h5"], "gone.h5")
    remote = packer.open_dataset(url, output="bytes", storage_options=_obstore(proxy))
    shard = _shard(local, "images.h5")
    proxy.inject(["403"] * 3, match=f"GET /{BUCKET}/gone.h5/{shard}")
    with pytest.raises(FormatError, match=rf"{shard}'.*missing or access is denied.*403"):
        remote.reader.read_many([0])
    assert len(proxy.faults) == 2  # one request, no retry
    proxy.inject([])
    server.filesystem().rm_file(f"{url}/{shard}")
    proxy.served.clear()
    with pytest.raises(FormatError, match=rf"{shard}'.*missing or access is denied.*not found"):
        remote.reader.read_many([0])
    assert sum(f"GET /{BUCKET}/gone.h5/{shard}" in s for s in proxy.served) == 1


def test_replaced_object_is_refused(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path]
) -> None:
    url = server.upload(local["images.h5"], "replaced.h5")
    remote = packer.open_dataset(url, output="bytes", storage_options=_obstore(proxy))
    shard = _shard(local, "images.h5")
    data = (local["images.h5"] / shard).read_bytes()
    server.filesystem().pipe_file(f"{url}/{shard}", data[: len(data) // 2])
    with pytest.raises(FormatError, match=f"{shard}' was replaced after the dataset was opened"):
        remote.reader.read_many(range(len(remote)))


def test_a_corrupt_body_is_never_served(
    proxy: FaultProxy, local: dict[str, Path], urls: dict[str, str]
) -> None:
    """BMP files carry their xxh3 in the record table: a flipped byte is fetched again, and
    after the bounded attempts refused."""
    remote = packer.open_dataset(
        urls["images.bmp"], output="bytes", storage_options=_obstore(proxy)
    )
    proxy.inject(["flip"], match=f"GET /{BUCKET}/images.bmp/")
    assert _every(remote) == _every(_local(local, "images.bmp")) and proxy.faults == []
    proxy.inject(["flip"] * 4, match=f"GET /{BUCKET}/images.bmp/")
    with pytest.raises(FormatError, match="differs from its checksum in the record table"):
        remote[0]


def test_plain_http_reads_through_obstore(
    server: S3Server, local: dict[str, Path], urls: dict[str, str]
) -> None:
    fs = server.filesystem()
    for key in fs.find(urls["images.npy"]):
        fs.chmod(key, "public-read")
    url = f"{server.endpoint}/{server.bucket}/images.npy"
    remote = packer.open_dataset(url, output="bytes", storage_options={"backend": "obstore"})
    assert _every(remote) == _every(_local(local, "images.npy"))
    assert isinstance(remote.reader.remote.ranges(), store_obstore.ObstoreRanges)


def test_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(store_obstore.ENV, raising=False)
    assert store_obstore.backend_of({}) == "obstore"  # the default: installed, it pays
    assert store_obstore.backend_of({"backend": "fsspec"}) == "fsspec"
    botocore_only = {"config_kwargs": {"response_checksum_validation": "when_supported"}}
    assert store_obstore.backend_of(botocore_only) == "fsspec"  # an option obstore lacks
    assert store_obstore.backend_of({}, "gs://b/x.npy") == "fsspec"
    with pytest.raises(PackerError, match=r"reads s3://, s3a://, http://, https:// only"):
        store_obstore.backend_of({"backend": "obstore"}, "gs://b/x.npy")
    monkeypatch.setenv(store_obstore.ENV, "fsspec")
    assert store_obstore.backend_of({}) == "fsspec"
    assert store_obstore.backend_of({"backend": "obstore"}) == "obstore"
    assert RemoteFolder("s3://b/x.npy", {"backend": "fsspec"}).ranges() is not None
    with pytest.raises(PackerError, match=r"PACKER_REMOTE_BACKEND is 'rust'; expected one of"):
        monkeypatch.setenv(store_obstore.ENV, "rust")
        store_obstore.backend_of({})
    folder = RemoteFolder("gs://b/x.npy", {"backend": "obstore"})  # not obstore's: fsspec
    assert store_obstore.fsspec_options("gs", folder.options) == {}


def test_s3fs_options_map_to_obstore_or_are_refused() -> None:
    config, client, chain = store_obstore.obstore_config(
        {
            "endpoint_url": "http://127.0.0.1:9000",
            "key": "K",
            "secret": "S",
            "client_kwargs": {"region_name": "eu-west-3"},
            "config_kwargs": {"read_timeout": 7, "max_pool_connections": 64},
            "backend": "obstore",
        }
    )
    assert config == {
        "endpoint": "http://127.0.0.1:9000",
        "access_key_id": "K",
        "secret_access_key": "S",
        "region": "eu-west-3",
    }
    assert client["read_timeout"] == "7.0s" and client["allow_http"] and not chain
    config, _, chain = store_obstore.obstore_config({"anon": True})
    assert config["skip_signature"] and not chain
    assert store_obstore.obstore_config({})[2]  # credentials from botocore's chain
    with pytest.raises(PackerError, match=r"session_kwargs are not understood.*'fsspec'"):
        store_obstore.obstore_config({"session_kwargs": {}})


def test_a_port_or_name_with_404_in_it_is_no_missing_object() -> None:
    """A refused connection to port 40404 is retried, not read as a 404 (it was, whenever the
    tests' random port held those digits); a real 404 or 403 still is not retried."""
    from botocore.exceptions import ClientError, EndpointConnectionError

    for port in (40404, 14030, 403, 404):
        assert passing(EndpointConnectionError(endpoint_url=f"http://127.0.0.1:{port}/b/k"))
    assert passing(ConnectionError("reset while reading s3://b/shard-00404.npy"))
    for code in ("404", "403"):
        missing = ClientError({"Error": {"Code": code, "Message": "x"}}, "HeadObject")
        assert not passing(missing)
    assert not passing(ConnectionError("HTTP 404 Not Found"))


def test_obstore_errors_read_as_fsspec_errors() -> None:
    """The status decides, never a number elsewhere in obstore's text (a timing, a port)."""
    cut = GenericError("Generic S3 error: HTTP error: request or response body error")
    throttled = GenericError(
        "Generic S3 error: Error performing GET http://h/b/k in 1.2ms - Server returned "
        "non-2xx status code: 429 Too Many Requests: <Error/>\n\nDebug source:\n..."
    )
    odd = GenericError(
        "Generic S3 error: Error performing GET http://h/b/k in 503.1ms - Server returned "
        "non-2xx status code: 400 Bad Request: <Error/>"
    )
    assert passing(store_obstore._plain("s3://b/k", cut))
    assert passing(store_obstore._plain("s3://b/k", throttled))
    assert "Debug source" not in str(store_obstore._plain("s3://b/k", throttled))
    assert not passing(store_obstore._plain("s3://b/k", odd))
    unauthorized = GenericError(
        "Generic S3 error: Error performing GET http://h/b/k - Server returned non-2xx status "
        "code: 401 Unauthorized: <Error/>"
    )
    denied = remote_error("s3://b/k", store_obstore._plain("s3://b/k", unauthorized))
    assert isinstance(denied, FormatError) and "access is denied" in str(denied)


def test_max_pool_connections_caps_the_requests_in_flight(
    proxy: FaultProxy, local: dict[str, Path], urls: dict[str, str]
) -> None:
    """obstore's pool has no cap of its own: s3fs's ``max_pool_connections`` is kept as the
    number of a batch's ranged GETs in flight at once."""
    shards = len(load_manifest(local["images.npy"]).shards)
    assert shards >= 4
    options = _obstore(proxy, config_kwargs={"max_pool_connections": 2})
    remote = packer.open_dataset(urls["images.npy"], output="bytes", storage_options=options)
    proxy.delay, proxy.most_in_flight = 0.2, 0
    try:
        assert remote.reader.read_many(range(len(remote))) == _every(_local(local, "images.npy"))
    finally:
        proxy.delay = 0.0
    assert proxy.most_in_flight == 2


def test_reads_from_a_thread_that_runs_an_event_loop(
    proxy: FaultProxy, local: dict[str, Path], urls: dict[str, str]
) -> None:
    """A notebook's cells run inside an event loop: obstore's futures run on packer's own."""
    remote = packer.open_dataset(urls["images.h5"], output="bytes", storage_options=_obstore(proxy))

    async def inside() -> list[bytes]:
        return _every(remote)

    assert asyncio.run(inside()) == _every(_local(local, "images.h5"))
