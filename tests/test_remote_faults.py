"""Remote reads through a real fault-injecting proxy (issue 21, item 5): HTTP 503 and 429,
connections dropped mid-body and bodies cut short are retried by packer's storage layer with
bounded backoff and give the right bytes, or fail with an error naming the URL and the attempts;
403/404 are not retried; an object replaced after the dataset was opened is refused.

botocore's and s3fs's own retries are off for s3 by default (packer.remote.obstore_backend.fsspec_options and
``fs.retries = 1``), so the retries seen here are packer's."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_proxy import FaultProxy
from s3_server import S3Server

import packer
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.errors import FormatError, PackerError
from packer.read.verify import verify
from packer.remote import storage
from packer.write.convert import convert_video

BUCKET = "faults"  # the module's bucket on the shared S3 server (conftest)


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=4, base=0.01, cap=0.05))
    # the fsspec read backend here; tests/test_remote_obstore.py meets the same faults through obstore
    monkeypatch.setenv("PACKER_REMOTE_BACKEND", "fsspec")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("faults")
    tree = make_image_tree(root / "src", classes=2, per_class=4, size=(64, 48), bad=0)
    packer.convert(tree.root, root / "images.h5", shard_size="20kB", workers=1, progress=False)
    return root / "images.h5"


@pytest.fixture(scope="module")
def url(server: S3Server, local: Path) -> str:
    return server.upload(local, "images.h5")


def _through(proxy: FaultProxy) -> dict[str, str]:
    return {"endpoint_url": proxy.endpoint}


def _expected(local: Path) -> list[bytes]:
    dataset = packer.open_dataset(local, output="bytes")
    return [dataset[i][0] for i in range(len(dataset))]


@pytest.mark.parametrize("faults", [["503", "429", "503"], ["drop", "drop"], ["short", "503"]])
def test_passing_faults_are_retried(
    proxy: FaultProxy, local: Path, url: str, faults: list[str]
) -> None:
    remote = packer.open_dataset(url, output="bytes", storage_options=_through(proxy))
    shard = load_manifest(local).shards[0].name
    proxy.inject(faults, match=f"GET /faults/images.h5/{shard}")
    assert remote.reader.read_many(range(len(remote))) == _expected(local)
    assert proxy.faults == []  # every fault was met, and retried past


@pytest.mark.parametrize("fault", ["503", "short", "drop"])
def test_endless_faults_end_in_a_clear_error(
    proxy: FaultProxy, local: Path, url: str, fault: str
) -> None:
    """A cut body is never served as a sample: after the bounded attempts, an error."""
    remote = packer.open_dataset(url, output="bytes", storage_options=_through(proxy))
    shard = load_manifest(local).shards[0].name
    proxy.inject([fault] * 10, match=f"GET /faults/images.h5/{shard}")
    with pytest.raises(PackerError, match=rf"{shard}'.*4 attempts over .*s all failed") as info:
        remote.reader.read_many([0])
    assert not isinstance(info.value, FormatError)
    assert len(proxy.faults) == 6  # 4 tries (a count: no bound on how long the machine took)
    proxy.inject([])


def test_missing_object_is_not_retried(proxy: FaultProxy, server: S3Server) -> None:
    proxy.served.clear()
    with pytest.raises(FormatError, match=r"gone\.h5/packer\.json' is not there"):
        packer.open_dataset("s3://faults/gone.h5", storage_options=_through(proxy))
    asked = [s for s in proxy.served if "gone.h5" in s]
    assert asked and len(asked) == len(set(asked))  # s3fs's one try (HEAD, listing), once


def test_denied_range_is_not_retried(proxy: FaultProxy, local: Path, url: str) -> None:
    remote = packer.open_dataset(url, output="bytes", storage_options=_through(proxy))
    shard = load_manifest(local).shards[0].name
    proxy.inject(["403"] * 3, match=f"GET /faults/images.h5/{shard}")
    with pytest.raises(FormatError, match=rf"{shard}'.*missing or access is denied.*credentials"):
        remote.reader.read_many([0])
    assert len(proxy.faults) == 2  # one request, no retry
    proxy.inject([])


def test_replaced_object_is_refused(proxy: FaultProxy, server: S3Server, local: Path) -> None:
    """Replaced after the open (another size): the next failed or short read says so at
    once (no retries), never mixing the old and new bytes."""
    url = server.upload(local, "replaced.h5")
    remote = packer.open_dataset(url, output="bytes", storage_options=_through(proxy))
    shard = load_manifest(local).shards[0].name
    data = (local / shard).read_bytes()
    server.filesystem().pipe_file(f"{url}/{shard}", data[: len(data) // 2])
    proxy.served.clear()
    with pytest.raises(FormatError, match=f"{shard}' was replaced after the dataset was opened"):
        remote.reader.read_many(range(len(remote)))
    assert sum(f"GET /faults/replaced.h5/{shard}" in s for s in proxy.served) == 1


@pytest.mark.usefixtures("whole_shards")  # the cache's download of the shard is what fails
def test_an_object_replaced_by_one_of_its_size_is_refused_by_its_etag(
    proxy: FaultProxy, server: S3Server, local: Path, tmp_path: Path
) -> None:
    """Issue 28, 14: an LMDB shard replaced after the open by other bytes of the same size
    (zeros): only the ETag tells. The shard cache's download fails its checksum, and the
    replaced-object check says so at once, with both ETags (one GET, no retries), instead of
    fetching it again until the attempts run out."""
    tree = make_image_tree(tmp_path / "src", classes=2, per_class=2, size=(64, 48), bad=0)
    packer.convert(tree.root, tmp_path / "same.lmdb", shard_size="20kB", workers=1, progress=False)
    url = server.upload(tmp_path / "same.lmdb", "same.lmdb")
    remote = packer.open_dataset(
        url, output="bytes", storage_options=_through(proxy), cache_dir=tmp_path / "cache"
    )
    shard = load_manifest(tmp_path / "same.lmdb").shards[0].name
    size = (tmp_path / "same.lmdb" / shard).stat().st_size
    server.filesystem().pipe_file(f"{url}/{shard}", bytes(size))
    proxy.served.clear()
    said = rf"{shard}' was replaced after the dataset was opened: it has {size} bytes \(ETag "
    with pytest.raises(FormatError, match=said + rf".*but had {size} bytes \(ETag "):
        remote.reader.read_many(range(len(remote)))
    assert sum(f"GET /faults/same.lmdb/{shard}" in s for s in proxy.served) == 1


def test_an_uncached_shard_replaced_by_one_of_its_size_is_refused_by_its_etag(
    proxy: FaultProxy, server: S3Server, local: Path
) -> None:
    """The same replacement under ranged reads (HDF5, no cache): every record's xxh3 fails,
    and the first mismatch asks the store for the object's ETag, so the read is refused as
    replaced after the open at once (one GET of it, no re-reads), with both ETags."""
    url = server.upload(local, "same.h5")
    remote = packer.open_dataset(url, output="bytes", storage_options=_through(proxy))
    shard = load_manifest(local).shards[0].name
    size = (local / shard).stat().st_size
    server.filesystem().pipe_file(f"{url}/{shard}", bytes(size))
    proxy.served.clear()
    said = rf"{shard}' was replaced after the dataset was opened: it has {size} bytes \(ETag "
    with pytest.raises(FormatError, match=said):
        remote.reader.read_many(range(len(remote)))
    assert sum(f"GET /faults/same.h5/{shard}" in s for s in proxy.served) == 1


def test_cut_body_of_a_per_sample_file_is_retried(
    proxy: FaultProxy, server: S3Server, tmp_path: Path
) -> None:
    """No size recorded at open (per-sample files): the store's size now tells a cut body
    (retried) from a truncated object (refused at once)."""
    frames = make_video_tree(tmp_path / "frames", classes=1, per_class=2)
    convert_video(frames.root, tmp_path / "videos.npy", workers=1, progress=False)
    url = server.upload(tmp_path / "videos.npy", "videos.npy")
    local = packer.open_dataset(tmp_path / "videos.npy", output="bytes", num_frames=2)
    remote = packer.open_dataset(url, output="bytes", num_frames=2, storage_options=_through(proxy))
    key = remote.keys[1]
    proxy.inject(["short", "drop"], match=f"GET /faults/videos.npy/{key}.npy")
    every = range(int(local.frame_counts[1]))
    assert remote.read_frames(1, every) == local.read_frames(1, every)
    assert proxy.faults == []


def test_verify_streams_again_after_a_drop(proxy: FaultProxy, local: Path, url: str) -> None:
    shard = load_manifest(local).shards[-1].name
    proxy.inject(["drop", "503"], match=f"GET /faults/images.h5/{shard}")
    report = verify(url, progress=False, storage_options=_through(proxy))
    assert report.ok, report.summary()
    assert report.files_checked == verify(local, progress=False).files_checked
    assert proxy.faults == []


def test_a_batch_of_ranged_gets_goes_out_together(
    server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    """A shuffled batch over many shards sends its ranged GETs together, past botocore's
    default pool of 10 connections (packer asks for storage.POOL); a pool the user sets wins."""
    tree = make_image_tree(tmp_path / "src", classes=3, per_class=8, size=(64, 48), bad=0)
    packer.convert(tree.root, tmp_path / "many.npy", shard_size="2kB", workers=1, progress=False)
    url = server.upload(tmp_path / "many.npy", "many.npy")
    counts = []
    for options in ({}, {"config_kwargs": {"max_pool_connections": 4}}):
        options = {"endpoint_url": proxy.endpoint, "backend": "fsspec", **options}  # s3fs's pool
        ds = packer.open_dataset(url, output="bytes", storage_options=options)
        assert len(ds.manifest.shards) == len(ds) == 24
        proxy.delay, proxy.most_in_flight = 0.3, 0
        try:
            ds.__getitems__(list(range(len(ds)))[::-1])  # 24 shards: 24 ranged GETs
        finally:
            proxy.delay = 0.0
        counts.append(proxy.most_in_flight)
        ds.close()
    assert counts[0] > 10 and counts[1] <= 4, counts


def test_the_tables_are_fetched_together_at_open(
    server: S3Server, proxy: FaultProxy, tmp_path: Path
) -> None:
    """Index, records and keys go out in one round trip (three requests in flight at once),
    each still checked against the manifest's xxh3."""
    tree = make_image_tree(tmp_path / "src", classes=2, per_class=2, size=(32, 24), bad=0)
    packer.convert(tree.root, tmp_path / "t.npy", workers=1, progress=False)
    url = server.upload(tmp_path / "t.npy", "tables.npy")
    proxy.delay, proxy.most_in_flight = 0.3, 0
    try:
        ds = packer.open_dataset(url, storage_options={"endpoint_url": proxy.endpoint})
    finally:
        proxy.delay = 0.0
    assert len(ds) == 4 and proxy.most_in_flight >= 3
    ds.close()


@pytest.mark.parametrize("backend", ["fsspec", "obstore"])
def test_a_flipped_byte_in_a_ranged_read_is_never_served(
    proxy: FaultProxy, local: Path, url: str, backend: str
) -> None:
    """Ranged reads without a cache check every record against the record table's xxh3 (TCP's
    checksum lets some corruption through; an http:// store has nothing else): a byte flipped
    on the way is fetched again; flipped every time, a clear error, never the wrong sample."""
    options = {**_through(proxy), "backend": backend}
    remote = packer.open_dataset(url, output="bytes", storage_options=options)
    shard = load_manifest(local).shards[0].name
    proxy.inject(["flip"], match=f"GET /faults/images.h5/{shard}")
    assert remote.reader.read_many(range(len(remote))) == _expected(local)
    assert proxy.faults == []
    proxy.inject(["flip"] * 4, match=f"GET /faults/images.h5/{shard}")
    with pytest.raises(FormatError, match=f"{shard}.*differs from its checksum"):
        remote.reader.read_many(range(len(remote)))
