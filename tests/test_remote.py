"""Remote datasets (issue 21, first step): NPY and HDF5 outputs read from a real S3 API server
on the loopback (moto's server mode, the real s3fs client), through DataLoader workers under
fork and spawn, byte for byte equal to the local dataset; damaged, missing and unsupported
objects are clear packer errors."""

from __future__ import annotations

import logging
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
from s3_server import S3Server
from torch.utils.data import DataLoader

import packer
from packer.core.manifest import INDEX_NAME, RECORDS_NAME, load_manifest
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.errors import FormatError, PackerError
from packer.remote.cache import wait_for_downloads
from packer.remote.storage import GAP, coalesce, is_url
from packer.write.convert import convert_video

IMAGES = ("images.npy", "images.h5")
VIDEOS = ("videos.npy", "videos.h5")
BUCKET = "data"  # the module's bucket on the shared S3 server (conftest)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Images (3 classes x 4, several shards) and videos (per-sample files) converted locally."""
    root = tmp_path_factory.mktemp("remote_src")
    images = make_image_tree(root / "images", classes=3, per_class=4, size=(64, 48), bad=0)
    frames = make_video_tree(root / "frames", classes=2, per_class=2)
    out = {}
    for name in (*IMAGES, "images.lmdb"):
        out[name] = root / name
        packer.convert(images.root, out[name], shard_size="20kB", workers=1, progress=False)
    for name in VIDEOS:
        out[name] = root / name
        convert_video(frames.root, out[name], shard_size="40kB", workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def urls(server: S3Server, local: dict[str, Path]) -> dict[str, str]:
    """Every local output uploaded to the bucket under its own name."""
    return {name: server.upload(path, name) for name, path in local.items()}


def list_collate(batch: list) -> list:
    return batch


def loaded(dataset: Any, context: str | None) -> list[tuple[Any, int]]:
    loader = DataLoader(
        dataset,
        batch_size=5,
        num_workers=2 if context else 0,
        multiprocessing_context=context,
        collate_fn=list_collate,
    )
    return [(data, int(label)) for batch in loader for data, label in batch]


def test_layouts_are_the_ones_covered(local: dict[str, Path]) -> None:
    for name in IMAGES:
        manifest = load_manifest(local[name])
        assert manifest.options["layout"] == "shards" and len(manifest.shards) > 1
    for name in VIDEOS:
        assert load_manifest(local[name]).options["layout"] == "per-sample"


@pytest.mark.parametrize("context", ["fork", "forkserver"])
@pytest.mark.parametrize("name", IMAGES)
def test_images_through_workers_equal_local(
    server: S3Server, local: dict[str, Path], urls: dict[str, str], name: str, context: str
) -> None:
    expected = loaded(packer.open_dataset(local[name], output="bytes"), None)
    remote = packer.open_dataset(urls[name], output="bytes", storage_options=server.options)
    assert remote[0] == expected[0]  # the parent reads first: workers must open their own client
    assert loaded(remote, context) == expected
    assert list(remote.keys) == list(packer.open_dataset(local[name]).keys)


@pytest.mark.parametrize("context", ["fork", "forkserver"])
@pytest.mark.parametrize("name", VIDEOS)
def test_videos_through_workers_equal_local(
    server: S3Server, local: dict[str, Path], urls: dict[str, str], name: str, context: str
) -> None:
    options: dict[str, Any] = {"output": "bytes", "num_frames": 4}
    local_set = packer.open_dataset(local[name], kind="video", **options)
    remote = packer.open_dataset(
        urls[name], kind="video", storage_options=server.options, **options
    )
    assert loaded(remote, context) == loaded(local_set, None)
    for i in range(len(remote)):  # every frame, adjacent ones coalesced into one range
        every = range(int(local_set.frame_counts[i]))
        assert remote.read_frames(i, every) == local_set.read_frames(i, every)


def _gets(caplog: pytest.LogCaptureFixture, name: str) -> int:
    """GET requests the server logged for objects under ``name`` (a 206 may be colored)."""
    return sum(f"GET /data/{name}/" in r.getMessage() for r in caplog.records)


def test_nearby_records_are_one_ranged_get(
    server: S3Server, local: dict[str, Path], urls: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A clip's frames cost one GET per video; a batch of every image one GET per shard."""
    videos = packer.open_dataset(urls["videos.npy"], output="bytes", storage_options=server.options)
    images = packer.open_dataset(urls["images.h5"], output="bytes", storage_options=server.options)
    with caplog.at_level(logging.INFO, logger="werkzeug"):
        caplog.clear()
        videos.read_frames(1, range(int(videos.frame_counts[1])))
        assert _gets(caplog, "videos.npy") == 1
        expected = [d for d, _ in loaded(images, None)]
        caplog.clear()
        assert images.reader.read_many(range(len(images))) == expected
        assert _gets(caplog, "images.h5") == len(load_manifest(local["images.h5"]).shards)


def test_batch_buffer_read_into(
    server: S3Server, local: dict[str, Path], urls: dict[str, str]
) -> None:
    local_set = packer.open_dataset(local["images.npy"], output="bytes", batch_buffer=True)
    remote = packer.open_dataset(
        urls["images.npy"], output="bytes", batch_buffer=True, storage_options=server.options
    )
    order = [7, 0, 11, 3, 5]
    ours, theirs = remote.__getitems__(order), local_set.__getitems__(order)
    assert bytes(ours.data.numpy()) == bytes(theirs.data.numpy())
    assert ours.offsets.tolist() == theirs.offsets.tolist()


def test_pickles_as_url_and_options(server: S3Server, urls: dict[str, str]) -> None:
    remote = packer.open_dataset(urls["images.h5"], output="bytes", storage_options=server.options)
    first = remote[3]
    folder = remote.reader.remote
    assert folder.fs() is folder.fs()  # one client per process, built once
    state = pickle.dumps(remote)
    assert b"S3FileSystem" not in state and b"aiobotocore" not in state
    copy = pickle.loads(state)
    assert copy.reader.remote._fs is None  # opened lazily, on the first read
    assert copy[3] == first


def test_a_split_output_at_a_url(server: S3Server, tmp_path: Path) -> None:
    tree = make_image_tree(tmp_path / "src", classes=2, per_class=3, size=(64, 48), bad=0)
    shutil.copytree(tree.root, tmp_path / "imagenet" / "train")
    shutil.copytree(tree.root, tmp_path / "imagenet" / "val")
    shutil.rmtree(tmp_path / "imagenet" / "val" / "class_01")  # the splits differ
    packer.convert(tmp_path / "imagenet", tmp_path / "split.npy", progress=False)
    url = server.upload(tmp_path / "split.npy", "split.npy")
    for split in ("train", "val"):
        local = packer.open_dataset(tmp_path / "split.npy", split=split, output="bytes")
        remote = packer.open_dataset(
            url, split=split, output="bytes", storage_options=server.options
        )
        assert [remote[i] for i in range(len(remote))] == [local[i] for i in range(len(local))]
    with pytest.raises(FormatError, match="holds splits train, val; pass split="):
        packer.open_dataset(url, storage_options=server.options)
    with pytest.raises(FormatError, match="not 'test'"):
        packer.open_dataset(url, split="test", storage_options=server.options)


@pytest.mark.parametrize("name", ["images.h5", "videos.npy"])
def test_plain_http_url(
    server: S3Server, local: dict[str, Path], urls: dict[str, str], name: str
) -> None:
    """The same objects over plain HTTP (the server serves them to anonymous GETs with Range):
    fsspec's HTTP file system, no listing (shard sizes by HEAD)."""
    url = f"{server.endpoint}/{server.bucket}/{name}"
    with pytest.raises(FormatError, match=r"packer\.json.*missing or access is denied.*403"):
        packer.open_dataset(url)  # private objects: a clear 403
    fs = server.filesystem()
    for key in fs.find(urls[name]):
        fs.chmod(key, "public-read")
    remote = packer.open_dataset(url, output="bytes")
    assert loaded(remote, "fork") == loaded(packer.open_dataset(local[name], output="bytes"), None)


def test_lmdb_url_reads_through_the_default_cache(
    server: S3Server,
    local: dict[str, Path],
    urls: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LMDB needs a local file: its shards go to the shard cache ($PACKER_CACHE_DIR here;
    tests/test_remote_cache.py covers the cache itself)."""
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    remote = packer.open_dataset(
        urls["images.lmdb"], output="bytes", storage_options=server.options
    )
    assert loaded(remote, None) == loaded(
        packer.open_dataset(local["images.lmdb"], output="bytes"), None
    )
    assert wait_for_downloads(30)  # (the first records came by range meanwhile)
    assert len(list((tmp_path / "cache").glob("*.data"))) == len(
        load_manifest(local["images.lmdb"]).shards
    )


def _copy(server: S3Server, local: Path, name: str) -> str:
    return server.upload(local, name)


def test_flipped_byte_in_a_remote_table_is_refused(
    server: S3Server, local: dict[str, Path]
) -> None:
    for table in (INDEX_NAME, RECORDS_NAME):
        url = _copy(server, local["images.npy"], f"flipped-{table}.npy")
        fs = server.filesystem()
        data = bytearray(fs.cat_file(f"{url}/{table}"))
        data[-3] ^= 0x01
        fs.pipe_file(f"{url}/{table}", bytes(data))
        with pytest.raises(FormatError, match=f"{table}.*differs from the checksum"):
            packer.open_dataset(url, storage_options=server.options)


def test_missing_dataset_names_the_url(server: S3Server) -> None:
    url = f"s3://{server.bucket}/nothing-here.npy"
    with pytest.raises(FormatError, match=r"nothing-here\.npy/packer\.json.*is not there"):
        packer.open_dataset(url, storage_options=server.options)
    with pytest.raises(FormatError, match="no-such-bucket/x.npy/packer.json' is not there"):
        packer.open_dataset("s3://no-such-bucket/x.npy", storage_options=server.options)


def test_missing_or_resized_shard_is_refused(server: S3Server, local: dict[str, Path]) -> None:
    shard = load_manifest(local["images.h5"]).shards[1].name
    url = _copy(server, local["images.h5"], "gone.h5")
    server.filesystem().rm_file(f"{url}/{shard}")
    with pytest.raises(FormatError, match=f"{shard}' is missing but the manifest records"):
        packer.open_dataset(url, storage_options=server.options)
    url = _copy(server, local["images.h5"], "short.h5")
    server.filesystem().pipe_file(f"{url}/{shard}", (local["images.h5"] / shard).read_bytes()[:-1])
    with pytest.raises(FormatError, match=f"{shard}' has .* bytes but the manifest records"):
        packer.open_dataset(url, storage_options=server.options)


def test_truncated_per_sample_object_is_a_clear_error(
    server: S3Server, local: dict[str, Path]
) -> None:
    url = _copy(server, local["videos.npy"], "cut.npy")
    dataset = packer.open_dataset(url, output="bytes", storage_options=server.options)
    key = dataset.keys[0]
    server.filesystem().pipe_file(f"{url}/{key}.npy", b"\x93NUMPY")
    with pytest.raises(FormatError, match=f"{key}.npy' is shorter than a record"):
        dataset.read_frames(0, range(int(dataset.frame_counts[0])))
    # shorter, still covering the first range: the short body is refused, never served
    first = int(dataset.reader.offset[0]) + int(dataset.reader.length[0])
    server.filesystem().pipe_file(
        f"{url}/{key}.npy", (local["videos.npy"] / f"{key}.npy").read_bytes()[: first - 1]
    )
    with pytest.raises(FormatError, match=f"{key}.npy'.* (ends before byte|is shorter)"):
        dataset.read_frames(0, [0])


def test_unreachable_endpoint_is_a_packer_error() -> None:
    options = {
        "endpoint_url": "http://127.0.0.1:9",  # discard port: nothing listens
        "retries": 1,
        "config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1},
    }
    with pytest.raises(PackerError, match=r"s3://data/x\.npy/packer\.json"):
        packer.open_dataset("s3://data/x.npy", storage_options=options)


def test_storage_options_need_a_url(local: dict[str, Path]) -> None:
    with pytest.raises(FormatError, match="storage_options is for a URL"):
        packer.open_dataset(local["images.npy"], storage_options={"anon": True})


def test_url_detection_and_remote_coalescing() -> None:
    assert is_url("s3://b/x.npy") and is_url("https://h/x.h5") and is_url("gs://b/x")
    assert not is_url("out.npy") and not is_url("/data/x.npy") and not is_url("file:///x")
    assert not is_url(Path("s3://b/x"))  # a Path is always local
    # records 100 bytes apart share one GET; a record GAP bytes past the run starts another
    assert coalesce([0, 200, 200 + GAP + 100], [100, 100, 10], GAP) == [
        (0, 300, 0, 2),
        (GAP + 300, GAP + 310, 2, 3),
    ]


def test_sharded_epoch_fetches_runs_of_records_per_get(
    server: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An uncached URL under ShardedSampler: batches hold runs of consecutive records, so each
    ranged GET brings >= 8 records (one sample shuffled at a time: ~1-2), every sample once."""
    tree = make_image_tree(tmp_path / "src", classes=2, per_class=100, size=(64, 48), bad=0)
    packer.convert(tree.root, tmp_path / "runs.npy", shard_size="200kB", workers=1, progress=False)
    url = server.upload(tmp_path / "runs.npy", "runs.npy")
    local = packer.open_dataset(tmp_path / "runs.npy", output="bytes")
    every = sorted(data for data, _ in local)
    per_get = {}
    for run in (None, 1):
        remote = packer.open_dataset(url, output="bytes", storage_options=server.options)
        assert remote.preferred_run == 16
        remote.reader.gap = 1  # only records side by side share a GET (as records > GAP do)
        sampler = packer.ShardedSampler(remote, seed=3, run=run)
        loader = DataLoader(
            remote, batch_size=32, sampler=sampler, num_workers=2, collate_fn=list_collate
        )
        with caplog.at_level(logging.INFO, logger="werkzeug"):
            caplog.clear()
            read = sorted(data for batch in loader for data, _ in batch)
            per_get[run] = len(remote) / _gets(caplog, "runs.npy")
        assert read == every
    assert per_get[None] >= 8 > 3 > per_get[1], per_get
    assert local.preferred_run == 1
    cached = packer.open_dataset(
        url, output="bytes", storage_options=server.options, cache_dir=tmp_path / "cache"
    )
    assert cached.preferred_run == 1  # whole shards from the cache
