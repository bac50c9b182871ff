"""Writing to object storage (issue 21, item 6): ``packer convert SRC s3://bucket/out.X`` builds
the output in a staging folder and uploads it, the manifest last, through the real CLI against a
real S3 API server on the loopback (moto) and the real s3fs client; the objects equal a local
conversion's files byte for byte (the manifest up to its ``created`` time)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fault_proxy import HANG, FaultProxy, fault_proxy
from s3_server import S3Server

import packer
from packer.cli.app import main
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.errors import DestinationError
from packer.remote import storage
from packer.upload.staging import staging_folder
from packer.write.convert import convert_video

BUCKET = "write"  # the module's bucket on the shared S3 server (conftest)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("write_src")
    images = make_image_tree(root / "images", classes=2, per_class=4, size=(64, 48), bad=0)
    frames = make_video_tree(root / "frames", classes=2, per_class=1)
    return {"images": images.root, "frames": frames.root}


def run(endpoint: str, staging: Path, *args: str) -> Result:
    """``packer ARGS`` through the CLI, staging in ``staging``, the store at ``endpoint``."""
    options = ["--staging", str(staging), "--storage-option", f"endpoint_url={endpoint}"]
    workers = ["--workers", "1"] if args[0] == "convert" else []
    return CliRunner().invoke(main, [*args, *options, *workers])


def objects(server: S3Server, url: str) -> dict[str, bytes]:
    """Every object under ``url`` by its name relative to it, with its bytes."""
    fs = server.filesystem()
    root = url.split("://", 1)[1].rstrip("/") + "/"
    return {path[len(root) :]: fs.cat_file(path) for path in fs.find(url)}


def files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def assert_same_dataset(found: dict[str, bytes], expected: dict[str, bytes]) -> None:
    """The same files with the same bytes; manifests equal but for their creation time."""
    assert sorted(found) == sorted(expected)
    for name, data in expected.items():
        if name.rsplit("/", 1)[-1] == "packer.json":
            mine, theirs = json.loads(found[name]), json.loads(data)
            assert mine.pop("created") and theirs.pop("created")
            assert mine == theirs, name
        else:
            assert found[name] == data, name


FORMATS = ["images.lmdb", "images.npy", "images.h5", "images.bmp", "videos.npy"]


@pytest.mark.parametrize("name", FORMATS)
def test_convert_to_s3_equals_a_local_conversion(
    server: S3Server, sources: dict[str, Path], tmp_path: Path, name: str
) -> None:
    src = sources["images" if name.startswith("images") else "frames"]
    url = f"s3://write/{name}"
    done = run(
        server.endpoint,
        tmp_path / "staging",
        "convert",
        str(src),
        url,
        "--shard-size",
        "20kB",
        "-q",
    )
    assert done.exit_code == 0, done.output
    assert f"to {url}" in done.output and "the manifest last" in done.output
    local = tmp_path / name
    if name.startswith("videos"):
        convert_video(src, local, shard_size="20kB", workers=1, progress=False)
    else:
        packer.convert(src, local, shard_size="20kB", workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))
    assert not any((tmp_path / "staging").iterdir())  # the staging folder is removed
    if name.endswith((".lmdb", ".bmp")):
        return  # reading these from a URL needs the shard cache (another step of issue 21)
    remote = packer.open_dataset(url, output="bytes", storage_options=server.options)
    near = packer.open_dataset(local, output="bytes")
    assert [remote[i] for i in range(len(remote))] == [near[i] for i in range(len(near))]
    if name == "images.npy":
        options = ["--storage-option", f"endpoint_url={server.endpoint}", "-q"]
        verified = CliRunner().invoke(main, ["verify", url, *options])
        assert verified.exit_code == 0 and "OK" in verified.output, verified.output


def test_existing_dataset_refused_then_overwritten_manifest_first(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    """An existing dataset is refused; --overwrite deletes its manifest before any upload,
    uploads the new manifest last, then deletes the old output's stale objects."""
    src, url, staging = str(sources["images"]), "s3://write/over.npy", tmp_path / "staging"
    given = ["--shard-size", "10kB", "-q", "--keep-staging"]
    first = run(server.endpoint, staging, "convert", src, url, *given)
    assert first.exit_code == 0, first.output
    old = objects(server, url)
    assert "shard-00001.npy" in old
    kept = staging_folder(url, staging, {"endpoint_url": server.endpoint}) / "over.npy"
    assert files(kept) == old  # --keep-staging: the staged output is what was uploaded
    again = run(server.endpoint, staging, "convert", src, url, "-q")  # even from its staging
    assert again.exit_code == 1
    assert "already holds a packer dataset" in again.output and "--overwrite" in again.output
    assert objects(server, url) == old and files(kept) == old  # nothing touched
    with fault_proxy(server.endpoint) as proxy:
        new = run(proxy.endpoint, staging, "convert", src, url, "-q", "--overwrite")
        assert new.exit_code == 0, new.output
        writes = [
            r.split(" -> ")[0] for r in proxy.served if r.startswith(("PUT", "DELETE", "POST"))
        ]
    manifest = "/write/over.npy/packer.json"
    assert writes[0] == f"DELETE {manifest}"  # the old manifest goes first
    puts = [w for w in writes if w.startswith("PUT")]
    assert puts[-1] == f"PUT {manifest}" and len(puts) == 5  # the new one last
    assert writes.index(puts[-1]) < len(writes) - 1  # then the stale shard is deleted
    packer.convert(src, tmp_path / "local.npy", workers=1, progress=False)
    now = objects(server, url)
    assert_same_dataset(now, files(tmp_path / "local.npy"))
    assert f"{len(set(old) - set(now))} stale object(s)" in new.output


def test_splits_upload_their_manifests_last_and_a_503_is_retried(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "imagenet"
    shutil.copytree(sources["images"], root / "train")
    shutil.copytree(sources["images"], root / "val")
    shutil.rmtree(root / "val" / "class_01")
    url = "s3://write/split.h5"
    with fault_proxy(server.endpoint) as proxy:
        proxy.inject(["503", "503"], match="PUT /write/split.h5/train/shard")
        done = run(proxy.endpoint, tmp_path / "staging", "convert", str(root), url, "-q")
        assert done.exit_code == 0, done.output
        puts = [r for r in proxy.served if r.startswith("PUT /write/split.h5/")]
    assert sum(r.endswith("-> 503") for r in puts) == 2  # retried after each
    names = [r.split(" -> ")[0].split("/write/split.h5/")[1] for r in puts if "forwarded" in r]
    assert names[-3:] in (
        ["train/packer.json", "val/packer.json", "packer.json"],
        ["val/packer.json", "train/packer.json", "packer.json"],
    )
    packer.convert(root, tmp_path / "local.h5", workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(tmp_path / "local.h5"))
    remote = packer.open_dataset(url, split="val", output="bytes", storage_options=server.options)
    near = packer.open_dataset(tmp_path / "local.h5", split="val", output="bytes")
    assert [remote[i] for i in range(len(remote))] == [near[i] for i in range(len(near))]


def test_refusals_are_clear(server: S3Server, sources: dict[str, Path], tmp_path: Path) -> None:
    src, staging = str(sources["images"]), tmp_path / "staging"
    http = run(server.endpoint, staging, "convert", src, f"{server.endpoint}/write/x.npy")
    assert http.exit_code == 1 and "read-only" in http.output
    bucket = run(server.endpoint, staging, "convert", src, "s3://write")
    assert bucket.exit_code == 1 and "names no dataset folder" in bucket.output
    local = CliRunner().invoke(main, ["convert", src, str(tmp_path / "x.npy"), "--staging", "s"])
    assert local.exit_code == 2 and "applies to a URL destination" in local.output
    limit = ["convert", src, str(tmp_path / "x.npy"), "--staging-limit", "1GB"]
    local = CliRunner().invoke(main, limit)
    assert local.exit_code == 2 and "--staging-limit applies to a URL" in local.output
    missing = run(
        "http://127.0.0.1:9", staging, "convert", str(tmp_path / "nope"), "s3://write/m.npy"
    )
    assert missing.exit_code == 1 and "nope' does not exist" in missing.output, missing.output
    zero = run(server.endpoint, staging, "convert", src, "s3://write/z.npy", "--staging-limit", "0")
    assert zero.exit_code == 1 and "invalid staging limit '0'" in zero.output, zero.output
    server.filesystem().pipe("write/foreign.npy/notes.txt", b"someone's data")
    foreign = run(server.endpoint, staging, "convert", src, "s3://write/foreign.npy", "--overwrite")
    assert foreign.exit_code == 1 and "not a packer dataset" in foreign.output
    assert objects(server, "s3://write/foreign.npy") == {"notes.txt": b"someone's data"}
    with pytest.raises(DestinationError, match="convert_to_url"):
        packer.convert(src, "s3://write/y.npy", workers=1, progress=False)


class HoldingProxy(FaultProxy):
    """A fault proxy whose requests containing ``hold`` get no answer until ``released`` is
    set; then they are answered 503 without reaching the server (their client is gone)."""

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.hold, self.held, self.released = "", [], threading.Event()

    def next_fault(self, request: str) -> str | None:
        if self.hold and self.hold in request:
            self.held.append(request)
            self.released.wait(HANG)
            return "503"
        return super().next_fault(request)


@contextmanager
def holding_proxy(upstream: str) -> Iterator[HoldingProxy]:
    proxy = HoldingProxy(upstream)
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.released.set()
        proxy.server.shutdown()
        proxy.server.server_close()


def test_upload_killed_then_resumed_equals_an_uninterrupted_one(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    """A real ``packer convert`` process SIGKILLed while its uploads of class_01/ hang (the
    class_00 shards sent while converting, their staged copies released): no manifest is at the
    URL; ``--resume`` sends only what is missing, never a released copy, and the objects equal
    an uninterrupted upload's."""
    src, url, staging = str(sources["images"]), "s3://write/killed.bmp", tmp_path / "staging"
    with holding_proxy(server.endpoint) as proxy:
        proxy.hold = "PUT /write/killed.bmp/class_01/"
        folder = staging_folder(url, staging, {"endpoint_url": proxy.endpoint})
        journal = folder / "upload-journal.jsonl"
        command = [sys.executable, "-m", "packer", "convert", src, url, "--workers", "1", "-q"]
        command += ["--staging", str(staging), "--storage-option", f"endpoint_url={proxy.endpoint}"]
        command += ["--shard-size", "100B"]  # a shard per image: 4 sent before class_01
        env = {**os.environ, "PYTHONPATH": str(Path(packer.__file__).parents[1])}
        child = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + HANG  # a hang guard: the conversion's pace is free
            while not (
                len(proxy.held) == 1
                and journal.is_file()
                and journal.read_text().count('"released": true') == 4  # class_00 sent
            ):
                assert child.poll() is None, child.communicate()[1]
                assert time.monotonic() < deadline, (proxy.held, proxy.served)
                time.sleep(0.02)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.communicate()
        at_kill = objects(server, url)
        assert sorted(at_kill) == [f"class_00/img_{i:05d}.bmp" for i in range(4)]
        released = sorted(staging.rglob("class_00/*.bmp"))
        assert len(released) == 4 and all(p.stat().st_blocks == 0 for p in released)
        with fault_proxy(server.endpoint) as counting:
            # staging is keyed by the store's endpoint: the same store, counted, takes it over
            folder.rename(staging_folder(url, staging, {"endpoint_url": counting.endpoint}))
            again = ["-q", "--resume", "--shard-size", "100B"]
            resumed = run(counting.endpoint, staging, "convert", src, url, *again)
            puts = [r for r in counting.served if r.startswith("PUT /write/killed.bmp/")]
    assert resumed.exit_code == 0, resumed.output
    assert "4 already uploaded" in resumed.output and len(puts) == 8, puts
    assert not any("class_00" in p for p in puts)
    straight = run(
        server.endpoint,
        tmp_path / "other",
        "convert",
        src,
        "s3://write/straight.bmp",
        "--shard-size",
        "100B",
    )
    assert straight.exit_code == 0, straight.output
    final = objects(server, url)
    assert_same_dataset(final, objects(server, "s3://write/straight.bmp"))
    assert "packer.json" in final and len(final) == 12
    assert not staging.exists() or not any(staging.iterdir())


def test_parts_staged_then_merged_into_a_url(
    server: S3Server, sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--part tasks share the staging folder (a whole conversion to the same URL is refused
    meanwhile) and send their shards as they finish them, freeing the staged copies; no
    manifest is uploaded; packer merge URL joins them and uploads the tables and manifest; a
    merge whose upload failed is run again and sends only the rest; parts run again over the
    uploaded dataset are refused without --overwrite and replace it with it."""
    src, url, staging = str(sources["images"]), "s3://write/parts.lmdb", tmp_path / "shared"
    folder = staging_folder(url, staging, {"endpoint_url": server.endpoint})
    folder.mkdir(parents=True)
    with open(folder / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # as a running --part task holds it
        whole = run(server.endpoint, staging, "convert", src, url, "-q")
        assert whole.exit_code == 1 and "being written by another packer process" in whole.output
        assert (folder / ".lock").is_file()  # the refused process left the holder's lock alone
        for i in range(2):
            given = ["--part", f"{i}/2", "--shard-size", "8kB", "-q"]
            part = run(server.endpoint, staging, "convert", src, url, *given)
            assert part.exit_code == 0 and f"packer merge {url}" in part.output, part.output
            assert "data file(s) uploaded" in part.output, part.output
    packer.convert(src, tmp_path / "local.lmdb", shard_size="8kB", workers=1, progress=False)
    shards = sorted(n for n in files(tmp_path / "local.lmdb") if n.startswith("shard-"))
    assert sorted(objects(server, url)) == shards and len(shards) >= 2  # data only, no manifest
    staged = sorted(folder.glob("parts.lmdb.part-*/shard-*.mdb"))
    assert len(staged) == len(shards) and all(p.stat().st_blocks == 0 for p in staged)  # freed
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01))
    with fault_proxy(server.endpoint) as proxy:
        proxy.inject(["503"] * 2, match="PUT /write/parts.lmdb/records.npy")
        # staging is keyed by the store's endpoint: the same store behind the proxy takes it
        through = staging_folder(url, staging, {"endpoint_url": proxy.endpoint})
        folder.rename(through)
        cut = run(proxy.endpoint, staging, "merge", url)
        through.rename(folder)
        assert not any("PUT /write/parts.lmdb/shard-" in r for r in proxy.served)
    assert cut.exit_code == 1 and "records.npy': 2 attempts" in cut.output, cut.output
    assert "packer.json" not in objects(server, url)
    merged = run(server.endpoint, staging, "merge", url, "--keep-staging")
    assert merged.exit_code == 0 and "already uploaded" in merged.output, merged.output
    assert_same_dataset(objects(server, url), files(tmp_path / "local.lmdb"))
    kept = {n: b for n, b in files(folder / "parts.lmdb").items() if not n.startswith("shard-")}
    assert kept == {n: b for n, b in objects(server, url).items() if n in kept}  # the tables
    again = ["--part", "0/2", "--shard-size", "8kB", "-q"]
    refused = run(server.endpoint, staging, "convert", src, url, *again)
    assert refused.exit_code == 1 and "already holds a packer dataset" in refused.output
    assert "packer.json" in objects(server, url)  # left whole
    for i in range(2):
        given = ["--part", f"{i}/2", "--shard-size", "8kB", "-q", "--overwrite"]
        redo = run(server.endpoint, staging, "convert", src, url, *given)
        assert redo.exit_code == 0, redo.output
    assert "packer.json" not in objects(server, url)  # the parts replace it: its manifest first
    options = {"endpoint_url": server.endpoint}  # packer.merge of a URL: merge_to_url's work
    joined = packer.merge(url, storage_options=options, staging=staging, progress=False)
    assert joined.dst == url and joined.manifest.num_samples == len(
        packer.open_dataset(tmp_path / "local.lmdb")
    )
    assert_same_dataset(objects(server, url), files(tmp_path / "local.lmdb"))


def test_full_staging_disk_is_a_clear_error_then_resumes(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    """Staging on a real 40 kB tmpfs (CI runs as root): the .bmp output does not fit, the
    error says it is the upload's staging folder and how to move it; nothing is uploaded;
    after the disk grows, --resume finishes and uploads the same dataset."""
    src, url, disk = str(sources["images"]), "s3://write/full.bmp", tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(disk)])
    assert mounted.returncode == 0, "mounting a tmpfs needs root, as in CI"
    try:
        full = run(server.endpoint, disk, "convert", src, url, "-q")
        assert full.exit_code == 1, full.output
        assert "disk full" in full.output and "staging folder of the upload" in full.output
        assert "--staging DIR" in full.output and objects(server, url) == {}
        subprocess.run(["mount", "-o", "remount,size=4m", str(disk)], check=True)
        resumed = run(server.endpoint, disk, "convert", src, url, "-q", "--resume")
        assert resumed.exit_code == 0, resumed.output
    finally:
        subprocess.run(["umount", "-l", str(disk)])
    packer.convert(src, tmp_path / "local.bmp", workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(tmp_path / "local.bmp"))


def test_a_fresh_run_takes_over_its_own_interrupted_upload(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    """Objects without a manifest that this staging folder uploaded (here: an upload whose
    manifest never arrived) are ours: a run without --resume starts over and replaces them."""
    src, url, staging = str(sources["images"]), "s3://write/again.h5", tmp_path / "staging"
    first = run(server.endpoint, staging, "convert", src, url, "-q", "--keep-staging")
    assert first.exit_code == 0, first.output
    server.filesystem().rm_file("write/again.h5/packer.json")  # as if killed before it
    server.filesystem().pipe("write/again.h5/shard-00000.h5", b"a stale shard of ours")
    again = run(server.endpoint, staging, "convert", src, url, "-q")
    assert again.exit_code == 0, again.output
    assert "already uploaded" not in again.output  # started over: every object sent again
    packer.convert(src, tmp_path / "local.h5", workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(tmp_path / "local.h5"))


def test_dask_conversion_into_a_url(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    """--dask local:2: the shards are written by worker processes into the staging folder
    (which they share), then uploaded: the same objects as a local conversion."""
    src, url = str(sources["images"]), "s3://write/dask.npy"
    given = ["--dask", "local:2", "--shard-size", "8kB", "-q"]
    done = run(server.endpoint, tmp_path / "staging", "convert", src, url, *given)
    assert done.exit_code == 0, done.output
    packer.convert(src, tmp_path / "local.npy", shard_size="8kB", workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(tmp_path / "local.npy"))


def test_endless_503_names_the_object_then_resume_sends_the_rest(
    server: S3Server, sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01))
    src, url, staging = str(sources["images"]), "s3://write/throttled.npy", tmp_path / "s"
    with fault_proxy(server.endpoint) as proxy:
        proxy.inject(["503"] * 2, match="PUT /write/throttled.npy/shard-00001")
        failed = run(proxy.endpoint, staging, "convert", src, url, "--shard-size", "8kB", "-q")
        # staging is keyed by the store's endpoint: the same store without the proxy takes it
        staging_folder(url, staging, {"endpoint_url": proxy.endpoint}).rename(
            staging_folder(url, staging, {"endpoint_url": server.endpoint})
        )
    assert failed.exit_code == 1
    assert (
        "cannot upload to 's3://write/throttled.npy/shard-00001.npy': 2 attempts" in failed.output
    )
    assert "--resume" in failed.output and "packer.json" not in objects(server, url)
    resumed = run(server.endpoint, staging, "convert", src, url, "--shard-size", "8kB", "--resume")
    assert resumed.exit_code == 0 and "already uploaded" in resumed.output, resumed.output
    packer.convert(src, tmp_path / "local.npy", shard_size="8kB", workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(tmp_path / "local.npy"))


def test_an_uploaded_object_replaced_by_one_of_its_size_is_sent_again_on_resume(
    server: S3Server, sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28, 14: the journal says shard-00000 was uploaded; before ``--resume`` someone
    replaces that object at the URL with other bytes of the same size. Only its ETag tells: the
    resumed upload must not take it for its own (a published dataset whose shard fails its
    checksum). Its staged copy was released once sent, so it cannot be sent again: the resume
    is refused naming it, nothing is published, and the command the refusal gives
    (``--overwrite``) makes objects equal to a local conversion's."""
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01))
    src, url, staging = str(sources["images"]), "s3://write/swapped.npy", tmp_path / "s"
    with fault_proxy(server.endpoint) as proxy:
        proxy.inject(["503"] * 2, match="PUT /write/swapped.npy/shard-00001")
        failed = run(proxy.endpoint, staging, "convert", src, url, "--shard-size", "8kB", "-q")
        # staging is keyed by the store's endpoint: the same store without the proxy takes it
        staging_folder(url, staging, {"endpoint_url": proxy.endpoint}).rename(
            staging_folder(url, staging, {"endpoint_url": server.endpoint})
        )
    assert failed.exit_code == 1 and "--resume" in failed.output, failed.output
    fs = server.filesystem()
    sent = fs.cat_file("write/swapped.npy/shard-00000.npy")
    before = fs.info("write/swapped.npy/shard-00000.npy")["ETag"]
    fs.pipe_file("write/swapped.npy/shard-00000.npy", bytes(len(sent)))  # same size, zeros
    fs.invalidate_cache()
    after = fs.info("write/swapped.npy/shard-00000.npy")
    assert after["size"] == len(sent) and after["ETag"] != before
    resumed = run(server.endpoint, staging, "convert", src, url, "--shard-size", "8kB", "--resume")
    assert resumed.exit_code == 1, resumed.output
    said = " ".join(resumed.output.split())
    assert "'s3://write/swapped.npy/shard-00000.npy' (and 0 more) was uploaded" in said
    assert "no longer holds it as uploaded (deleted or replaced since)" in said
    assert "packer.json" not in objects(server, url)  # nothing published over the zeros
    again = run(server.endpoint, staging, "convert", src, url, "--shard-size", "8kB", "--overwrite")
    assert again.exit_code == 0, again.output
    packer.convert(src, tmp_path / "local.npy", shard_size="8kB", workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(tmp_path / "local.npy"))
