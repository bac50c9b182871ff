"""The node-local shard cache (issue 21, items 2-3) against a real S3 API server (moto) behind
the fault-injecting proxy, with real subprocesses: remote LMDB and BMP outputs through DataLoader
workers under fork and spawn; one download per shard per node; a reader killed mid-download
blocks nothing; the limit holds and never evicts a shard in use; a re-uploaded or corrupt
object is never served. Downloads are counted by the proxy's request log."""

from __future__ import annotations

import hashlib
import os
import pickle
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fault_proxy import HANG, FaultProxy
from s3_server import S3Server
from torch.utils.data import ConcatDataset, DataLoader
from torch.utils.data import _utils as torch_data_utils

import packer
from packer.cli.app import main
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.errors import FormatError, PackerError
from packer.remote import storage
from packer.remote.cache import ShardCache, wait_for_downloads
from packer.write.convert import convert_video

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "cache"
# these tests attack the cache's whole-shard downloads: no first batch by ranged GETs
pytestmark = pytest.mark.usefixtures("whole_shards")


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch, proxy: FaultProxy) -> Iterator[None]:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=3, base=0.01, cap=0.05))
    proxy.inject([])
    yield
    proxy.release()
    proxy.let_held_go()  # a failed test's held answers too
    proxy.released.clear()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Images in several LMDB shards and as BMP files, videos as LMDB and BMP."""
    root = tmp_path_factory.mktemp("cache_src")
    images = make_image_tree(root / "images", classes=3, per_class=4, size=(64, 48), bad=0)
    frames = make_video_tree(root / "frames", classes=2, per_class=1, frames=(3, 4))
    out = {}
    for name in ("images.lmdb", "images.bmp", "images.npy", "images.h5"):
        out[name] = root / name
        packer.convert(images.root, out[name], shard_size="6kB", workers=1, progress=False)
    for name in ("videos.lmdb", "videos.bmp"):
        out[name] = root / name
        convert_video(frames.root, out[name], shard_size="20kB", workers=1, progress=False)
    out["other.lmdb"] = root / "other.lmdb"  # another dataset, for the re-upload
    other = make_image_tree(root / "other", classes=3, per_class=4, size=(64, 48), bad=0, seed=7)
    packer.convert(other.root, out["other.lmdb"], shard_size="6kB", workers=1, progress=False)
    assert len(load_manifest(out["images.lmdb"]).shards) >= 4
    return out


def _upload(server: S3Server, local: Path, name: str) -> str:
    """``local`` at ``s3://cache/name``, replacing whatever was there."""
    fs = server.filesystem()
    if fs.exists(f"s3://{BUCKET}/{name}"):
        fs.rm(f"s3://{BUCKET}/{name}", recursive=True)
    return server.upload(local, name)


def _options(proxy: FaultProxy) -> dict[str, Any]:
    return {"endpoint_url": proxy.endpoint}


def _gets(proxy: FaultProxy, name: str) -> Counter[str]:
    """GETs the proxy served per object under the dataset ``name``."""
    prefix = f"GET /{BUCKET}/{name}/"
    return Counter(
        line.split(" ", 2)[1].split("?")[0] for line in proxy.served if line.startswith(prefix)
    )


def _shard_gets(proxy: FaultProxy, name: str) -> Counter[str]:
    return Counter({k: n for k, n in _gets(proxy, name).items() if "/shard-" in k})


def _downloads(proxy: FaultProxy, name: str) -> Counter[str]:
    """Whole-shard downloads per shard of the dataset ``name`` (its range starts at byte 0; a
    record's ranged GET never does: a shard starts with its header); ranged reads left out."""
    prefix = f"GET /{BUCKET}/{name}/"
    return Counter(
        request.split(" ", 2)[1].split("?")[0]
        for request, ranged, _ in list(proxy.sent)
        if request.startswith(prefix)
        and "/shard-" in request
        and (ranged is None or ranged.startswith("bytes=0-"))
    )


def _list(batch: list) -> list:
    return batch


def _loaded(dataset: Any, context: str | None) -> list[tuple[Any, int]]:
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=2 if context else 0,
        multiprocessing_context=context,
        collate_fn=_list,
    )
    return [(data, int(label)) for batch in loader for data, label in batch]


def _every(dataset: Any) -> list[bytes]:
    return [dataset[i][0] for i in range(len(dataset))]


def _cached_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.glob("*.data"))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_lmdb_and_bmp_through_workers_equal_local(
    server: S3Server,
    proxy: FaultProxy,
    local: dict[str, Path],
    tmp_path: Path,
    context: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both formats in one DataLoader (a ConcatDataset: one start of the workers)."""
    # torch gives an ending worker 5 s to exit, then kills it: a loaded machine's worker still
    # finishing its downloads at its exit was killed with them (3 of 6 shards never came, under
    # 16 busy loops); the workers' exit is awaited here (a hang guard of HANG s)
    monkeypatch.setattr(torch_data_utils, "MP_STATUS_CHECK_INTERVAL", HANG)
    names = ("images.lmdb", "images.bmp")
    urls = [_upload(server, local[name], f"{context}-{name}") for name in names]
    cache = tmp_path / "cache"
    remote = [
        packer.open_dataset(url, output="bytes", storage_options=_options(proxy), cache_dir=cache)
        for url in urls
    ]
    mine = [packer.open_dataset(local[name], output="bytes") for name in names]
    assert [d[0] for d in remote] == [d[0] for d in mine]  # the parent reads first
    assert _loaded(ConcatDataset(remote), context) == _loaded(ConcatDataset(mine), None)
    # LMDB: every shard downloaded once for the parent and both workers, into the cache (a
    # spawned worker serves its first records by range meanwhile: the module's defaults)
    shards = [s.name for s in load_manifest(local["images.lmdb"]).shards]
    assert _downloads(proxy, f"{context}-images.lmdb") == Counter(
        {f"/{BUCKET}/{context}-images.lmdb/{s}": 1 for s in shards}
    )
    assert sorted(p.read_bytes() for p in cache.glob("*.data")) == sorted(
        (local["images.lmdb"] / s).read_bytes() for s in shards
    )
    # BMP: whole objects, never through the cache
    assert type(remote[1].reader).__name__ == "RemoteReader"


@pytest.mark.parametrize("name", ["videos.lmdb", "videos.bmp"])
def test_remote_video_clips_equal_local(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path, name: str
) -> None:
    url = _upload(server, local[name], name)
    options = {"output": "bytes", "num_frames": 3, "kind": "video"}
    mine = packer.open_dataset(local[name], **options)
    remote = packer.open_dataset(
        url, storage_options=_options(proxy), cache_dir=tmp_path / "c", **options
    )
    assert _loaded(remote, None) == _loaded(mine, None)
    for i in range(len(remote)):
        every = range(int(mine.frame_counts[i]))
        assert remote.read_frames(i, every) == mine.read_frames(i, every)


@pytest.mark.parametrize("name", ["images.npy", "images.h5"])
def test_npy_and_hdf5_shards_cached_when_asked(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """With cache_dir= a shard is downloaded whole on first touch and a warm epoch reads the
    cache only; without it, records stay ranged GETs and nothing is cached."""
    url = _upload(server, local[name], f"cached-{name}")
    expected = _every(packer.open_dataset(local[name], output="bytes"))
    ranged = packer.open_dataset(url, output="bytes", storage_options=_options(proxy))
    assert type(ranged.reader).__name__ == "RemoteReader" and _every(ranged) == expected
    options = {"storage_options": _options(proxy), "cache_dir": tmp_path / "c"}
    cold = packer.open_dataset(url, output="bytes", **options)
    assert type(cold.reader).__name__ == "CachedShardReader" and _every(cold) == expected
    assert wait_for_downloads(HANG)  # records came by range while their shards downloaded
    before = _shard_gets(proxy, f"cached-{name}")
    warm = pickle.loads(pickle.dumps(packer.open_dataset(url, output="bytes", **options)))
    assert _every(warm) == expected
    assert _shard_gets(proxy, f"cached-{name}") == before  # no shard GET when warm
    shards = load_manifest(local[name]).shards
    assert sorted(p.read_bytes() for p in (tmp_path / "c").glob("*.data")) == sorted(
        (local[name] / s.name).read_bytes() for s in shards
    )


_READER = """
import hashlib, sys
from packer.read.store import open_packed  # no torch: the subprocess starts in well under a second
url, endpoint, cache = sys.argv[1:4]
if sys.argv[4:] == ["whole"]:  # as the whole_shards fixture: reads wait for their shards
    from packer.remote import cached_reader
    cached_reader.RANGED_SHARE = cached_reader.RANGED_FLOOR = cached_reader.AHEAD = 0
packed = open_packed(url, storage_options={"endpoint_url": endpoint}, cache_dir=cache)
digest = hashlib.sha256()
for first in packed.first.tolist():  # sample by sample, in order
    digest.update(packed.reader.read_many([first])[0])
print(digest.hexdigest())
"""


def _reader(url: str, proxy: FaultProxy, cache: Path, *mode: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    command = [sys.executable, "-c", _READER, url, proxy.endpoint, str(cache), *mode]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)


def _digest(dataset: Any) -> str:
    digest = hashlib.sha256()
    for data in _every(dataset):
        digest.update(data)
    return digest.hexdigest()


def test_two_processes_share_one_cache(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    url = _upload(server, local["images.lmdb"], "shared.lmdb")
    cache = tmp_path / "cache"
    shard = load_manifest(local["images.lmdb"]).shards[0]
    path = f"GET /{BUCKET}/shared.lmdb/{shard.name}"
    proxy.inject(["held"], match=f"{path} Range=bytes=0-{shard.bytes - 1};")  # one download
    readers = [_reader(url, proxy, cache) for _ in range(2)]

    def both_in() -> bool:  # the download held, and each reader had its first record by range
        firsts = [
            r for q, r, _ in proxy.sent if q.startswith(path) and r and not r.startswith("bytes=0-")
        ]
        return proxy.holding == 1 and len(firsts) >= 2

    proxy.wait_until(both_in)  # both want the shard at once: an event, not a 2 s head start
    proxy.let_held_go()
    outputs = [reader.communicate(timeout=HANG)[0].strip() for reader in readers]
    assert [reader.returncode for reader in readers] == [0, 0]
    expected = _digest(packer.open_dataset(local["images.lmdb"], output="bytes"))
    assert outputs == [expected, expected]
    shards = load_manifest(local["images.lmdb"]).shards
    # two processes of their own (the defaults: records by range while shards download)
    assert set(_downloads(proxy, "shared.lmdb").values()) == {1}
    assert len(_downloads(proxy, "shared.lmdb")) == len(shards)
    assert len(list(cache.glob("*.data"))) == len(shards)


def test_reader_killed_mid_download_blocks_nothing(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    url = _upload(server, local["images.lmdb"], "killed.lmdb")
    cache = tmp_path / "cache"
    first = load_manifest(local["images.lmdb"]).shards[0].name
    proxy.inject(["stall"], match=f"GET /{BUCKET}/killed.lmdb/{first}")
    reader = _reader(url, proxy, cache, "whole")
    proxy.wait_until(lambda: proxy.stalling == 1)  # the download has begun, and stalls
    assert not proxy.faults and list(cache.glob("*.part"))
    reader.send_signal(signal.SIGKILL)
    reader.wait(timeout=HANG)
    stale = ShardCache(cache).entries()
    assert [(e.partial, e.in_use) for e in stale] == [(True, False)]  # its lock died with it
    proxy.release()
    again = _reader(url, proxy, cache)  # must not wait on anything the killed one left
    out = again.communicate(timeout=HANG)[0].strip()
    assert again.returncode == 0
    assert out == _digest(packer.open_dataset(local["images.lmdb"], output="bytes"))
    assert not list(cache.glob("*.part"))  # the partial download was redone in its place
    assert not any(e.partial for e in ShardCache(cache).entries())


def test_limit_holds_least_recently_used_go_first(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    url = _upload(server, local["images.lmdb"], "limited.lmdb")
    shards = load_manifest(local["images.lmdb"]).shards
    largest = max(s.bytes for s in shards)
    cache, limit = tmp_path / "cache", 3 * largest
    remote = packer.open_dataset(
        url, output="bytes", storage_options=_options(proxy), cache_dir=cache, cache_limit=limit
    )
    expected = _every(packer.open_dataset(local["images.lmdb"], output="bytes"))
    for i in range(len(remote)):
        assert remote[i][0] == expected[i]
        assert _cached_bytes(cache) <= limit
    held = remote.reader.handles.capacity
    assert held == 2  # one process keeps at most limit // largest - 1 shards open
    kept = {e.url.rsplit("/", 1)[1] for e in ShardCache(cache).entries()}
    assert {s.name for s in shards[-held:]} <= kept  # the last ones read stayed
    assert shards[0].name not in kept  # the first one read went first


def test_a_download_under_way_counts_against_the_limit(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    """Room is made beside the downloads other readers have under way: shard 1 downloads
    (held at the proxy until shard 2 is in) when shard 2 is fetched, so shard 0, cached and
    unused, is evicted then. Counting only finished shards kept it, and the cache ended one
    shard over its limit."""
    url = _upload(server, local["images.lmdb"], "underway.lmdb")
    shards = load_manifest(local["images.lmdb"]).shards
    sizes = [s.bytes for s in shards[:3]]
    limit = sum(sizes) - 1  # any two of the three fit, not all three
    cache = tmp_path / "cache"
    options = {"storage_options": _options(proxy), "cache_dir": cache, "cache_limit": limit}
    reader = packer.open_dataset(url, output="bytes", **options).reader
    reader.cached(0).close()  # cached, not in use
    proxy.inject(["held"], match=f"GET /{BUCKET}/underway.lmdb/{shards[1].name}")
    assert reader.prefetch([1]) == 1
    proxy.wait_until(lambda: proxy.holding == 1)  # shard 1's download is under way, held
    assert list(cache.glob("*.part"))
    reader.cached(2).close()
    proxy.let_held_go()
    assert wait_for_downloads(HANG)
    cached = {e.url.rsplit("/", 1)[1] for e in ShardCache(cache).entries()}
    assert cached == {shards[1].name, shards[2].name}  # shard 0 made the room
    assert _cached_bytes(cache) <= limit


def test_a_shard_in_use_is_never_evicted(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    url = _upload(server, local["images.lmdb"], "inuse.lmdb")
    shards = load_manifest(local["images.lmdb"]).shards
    cache, limit = tmp_path / "cache", 2 * max(s.bytes for s in shards)
    options = {"storage_options": _options(proxy), "cache_dir": cache, "cache_limit": limit}
    holder = packer.open_dataset(url, output="bytes", **options)
    expected = _every(packer.open_dataset(local["images.lmdb"], output="bytes"))
    assert holder[0][0] == expected[0]  # holds shard 0 open (in use) from now on
    (pinned,) = list(cache.glob("*.data"))
    other = packer.open_dataset(url, output="bytes", **options)
    for i in range(len(other)):
        assert other[i][0] == expected[i]
        in_use = sum(e.bytes for e in ShardCache(cache).entries() if e.in_use)
        assert pinned.exists() and _cached_bytes(cache) <= limit + in_use
    assert holder[0][0] == expected[0]
    assert _shard_gets(proxy, "inuse.lmdb")[f"/{BUCKET}/inuse.lmdb/{shards[0].name}"] == 1
    state = {e.key: e.in_use for e in ShardCache(cache).entries()}
    assert state[pinned.stem]
    holder.close()  # released: evictable again
    assert not {e.key: e.in_use for e in ShardCache(cache).entries()}[pinned.stem]


def test_a_limit_below_one_shard_is_a_clear_error(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    url = _upload(server, local["images.lmdb"], "small.lmdb")
    largest = max(load_manifest(local["images.lmdb"]).shards, key=lambda s: s.bytes)
    options = {"storage_options": _options(proxy), "cache_dir": tmp_path / "cache"}
    with pytest.raises(PackerError, match=f"smaller than the largest shard.*{largest.name}.*"):
        packer.open_dataset(url, cache_limit=largest.bytes - 1, **options)
    with pytest.raises(PackerError, match="invalid size 'lots'"):
        packer.open_dataset(url, cache_limit="lots", **options)
    assert not _shard_gets(proxy, "small.lmdb")  # refused at open: nothing downloaded
    assert packer.open_dataset(url, cache_limit=largest.bytes, **options)[0]
    (tmp_path / "a-file").write_text("not a folder")
    options["cache_dir"] = tmp_path / "a-file"
    with pytest.raises(PackerError, match="cannot use the shard cache .*a-file.*writable folder"):
        packer.open_dataset(url, **options)[0]


def test_a_reupload_is_not_served_from_the_old_cache(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    options = {"output": "bytes", "storage_options": _options(proxy), "cache_dir": cache}
    url = _upload(server, local["images.lmdb"], "again.lmdb")
    assert _every(packer.open_dataset(url, **options)) == _every(
        packer.open_dataset(local["images.lmdb"], output="bytes")
    )
    url = _upload(server, local["other.lmdb"], "again.lmdb")  # another dataset, same URL
    assert _every(packer.open_dataset(url, **options)) == _every(
        packer.open_dataset(local["other.lmdb"], output="bytes")
    )
    # the same manifest, a shard replaced by other bytes of the same size (a new ETag): the
    # old, verified copy is not served; the new bytes are refused against the manifest
    shard = load_manifest(local["other.lmdb"]).shards[0].name
    data = bytearray((local["other.lmdb"] / shard).read_bytes())
    data[len(data) // 2] ^= 0x01
    server.filesystem().pipe_file(f"{url}/{shard}", bytes(data))
    dataset = packer.open_dataset(url, **options)
    with pytest.raises(FormatError, match=f"{shard}.*xxh3 differs from the manifest's"):
        _every(dataset)


# botocore checks a whole object's body against the CRC the store keeps ("when_supported"), and
# packer checks every download against the manifest's xxh3: each layer alone must stop the flip
CHECKS = {"botocore": "when_supported", "xxh3 only": "when_required"}


def _checking(proxy: FaultProxy, check: str) -> dict[str, Any]:
    config = {"response_checksum_validation": CHECKS[check]}
    return {"endpoint_url": proxy.endpoint, "config_kwargs": config}


@pytest.mark.parametrize("check", list(CHECKS))
def test_a_corrupt_byte_is_never_served(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path, check: str
) -> None:
    url = _upload(server, local["images.lmdb"], "flipped.lmdb")
    shard = load_manifest(local["images.lmdb"]).shards[1].name
    options = {"output": "bytes", "storage_options": _checking(proxy, check)}
    expected = _every(packer.open_dataset(local["images.lmdb"], output="bytes"))
    proxy.inject(["flip"], match=f"GET /{BUCKET}/flipped.lmdb/{shard}")
    assert _every(packer.open_dataset(url, cache_dir=tmp_path / "a", **options)) == expected
    assert proxy.faults == []  # the corrupt body came, and was downloaded again
    proxy.inject(["flip"] * 3, match=f"GET /{BUCKET}/flipped.lmdb/{shard}")
    dataset = packer.open_dataset(url, cache_dir=tmp_path / "b", **options)
    refusal = "3 downloads .* xxh3 differs from the manifest's" if check == "xxh3 only" else ""
    with pytest.raises(PackerError, match=f"{shard}.*{refusal or 'checksum'}"):
        _every(dataset)
    assert not list((tmp_path / "b").glob("*.part"))
    cached = {p.read_bytes() for p in (tmp_path / "b").glob("*.data")}
    assert cached == {
        (local["images.lmdb"] / load_manifest(local["images.lmdb"]).shards[0].name).read_bytes()
    }


@pytest.mark.parametrize("check", list(CHECKS))
def test_a_corrupt_bmp_body_is_never_served(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], check: str
) -> None:
    url = _upload(server, local["images.bmp"], "flipped.bmp")
    remote = packer.open_dataset(url, output="bytes", storage_options=_checking(proxy, check))
    expected = _every(packer.open_dataset(local["images.bmp"], output="bytes"))
    proxy.inject(["flip"], match=f"GET /{BUCKET}/flipped.bmp/")
    assert _every(remote) == expected and proxy.faults == []
    proxy.inject(["flip"] * 3, match=f"GET /{BUCKET}/flipped.bmp/")
    refusal = "differs from its checksum in the record table" if check == "xxh3 only" else ""
    with pytest.raises(PackerError, match=f"img_00000.bmp.*{refusal or 'checksum'}"):
        remote[0]


def test_cache_ls_and_clear(
    server: S3Server, proxy: FaultProxy, local: dict[str, Path], tmp_path: Path
) -> None:
    url = _upload(server, local["images.lmdb"], "listed.lmdb")
    cache = tmp_path / "cache"
    dataset = packer.open_dataset(
        url, output="bytes", storage_options=_options(proxy), cache_dir=cache
    )
    dataset[0]  # holds shard 0
    for i in range(len(dataset)):
        dataset[i]
    dataset.reader.handles.close_all()
    dataset[0]
    (cache / ("0" * 32 + ".part")).write_bytes(b"half")  # a dead downloader's leftover
    runner = CliRunner()
    listed = runner.invoke(main, ["cache", "ls", "--cache-dir", str(cache)])
    shards = load_manifest(local["images.lmdb"]).shards
    assert listed.exit_code == 0, listed.output
    assert f"{len(shards) + 1} objects" in listed.output
    assert listed.output.count("in use") == 1 and "stale partial" in listed.output
    assert f"s3://{BUCKET}/listed.lmdb/{shards[-1].name}" in listed.output
    cleared = runner.invoke(main, ["cache", "clear", "--cache-dir", str(cache)])
    assert cleared.exit_code == 0, cleared.output
    assert f"removed {len(shards)} objects" in cleared.output
    assert "skipped 1 in use" in cleared.output and shards[0].name in cleared.output
    assert [p.name for p in cache.glob("*.data")] != [] and not list(cache.glob("*.part"))
    dataset.close()
    cleared = runner.invoke(main, ["cache", "clear", "--cache-dir", str(cache)])
    assert "removed 1 objects" in cleared.output and "skipped" not in cleared.output
    assert sorted(p.name for p in cache.iterdir()) == [".evict.lock"]


def test_cache_options_stage_a_local_dataset(local: dict[str, Path], tmp_path: Path) -> None:
    # a local path with cache_dir= is staged through the cache (tests/test_local_staging.py)
    staged = packer.open_dataset(local["images.lmdb"], cache_dir=tmp_path)
    assert str(staged.root).startswith("file://") and staged[0] is not None
