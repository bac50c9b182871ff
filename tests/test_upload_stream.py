"""Bounded staging (issue 21, item 6): ``convert_to_url`` sends each shard while the conversion
runs and frees its staged copy, so the staging folder holds a few shards, not the dataset; the
objects still equal a local conversion's, and what a kill, a lost object or ``--overwrite``
leaves is safe. Real moto S3 server on the loopback, real s3fs client, the fault proxy's delay
making the upload slower than the conversion (so the limit is what holds staging down)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fault_proxy import FaultProxy
from s3_server import S3Server
from test_remote_write import assert_same_dataset, files, holding_proxy, objects

import packer
from packer.cli.app import main
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.errors import DestinationError
from packer.upload.staging import convert_to_url, merge_to_url, staging_folder

BUCKET = "stream"  # the module's bucket on the shared S3 server (conftest)
SHARD = 4096  # bytes of source per planned shard: ~2 images, ~20 shards
LIMIT = 8192  # bytes of finished shards that may wait for their upload
TABLES = ("index.npy", "records.npy", "keys.txt", "packer.json")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("stream_src")
    images = make_image_tree(root / "images", classes=2, per_class=20, size=(64, 48), bad=0)
    frames = make_video_tree(root / "frames", classes=2, per_class=3)
    return {"images": images.root, "frames": frames.root}


def data_on_disk(folder: Path) -> tuple[int, int]:
    """Bytes of disk blocks held by the staged output's data files (not the conversion's own
    ``_progress`` checkpoints, nor the journal), and the data files' sizes."""
    held = size = 0
    for path in folder.rglob("*"):
        if path.is_file() and "_progress" not in path.parts and path.suffix != ".jsonl":
            if path.name not in TABLES:
                st = path.stat()
                held, size = held + st.st_blocks * 512, size + st.st_size
    return held, size


class Watch:
    """An ``on_event`` noting the most disk the staged data held at any point (and, given the
    proxy, the most requests it served at once before the tables: while shards streamed)."""

    def __init__(self, folder: Path, proxy: FaultProxy | None = None) -> None:
        self.folder, self.most, self.events, self.proxy = folder, 0, 0, proxy
        self.streamed_at_once = 0

    def __call__(self, name: str, number: int) -> None:
        self.events += 1
        self.most = max(self.most, data_on_disk(self.folder)[0])
        if name == "tables" and self.proxy is not None:
            self.streamed_at_once = self.proxy.most_in_flight


class Poll(Watch):
    """A :class:`Watch` looking every 5 ms from a thread of this process (an executor's tasks
    run the events elsewhere)."""

    def __enter__(self) -> Poll:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def run(self) -> None:
        while not self.stop.wait(0.005):
            try:
                self("poll", 0)
            except OSError:  # a file renamed or removed while it was looked at
                continue

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


@pytest.mark.parametrize(
    ("kind", "name"), [("images", "out.lmdb"), ("images", "out.bmp"), ("frames", "out.npy")]
)
def test_staging_holds_a_few_shards_and_the_objects_equal_a_local_conversion(
    server: S3Server,
    proxy: FaultProxy,
    sources: dict[str, Path],
    tmp_path: Path,
    kind: str,
    name: str,
) -> None:
    """With the upload slower than the conversion, the staged data never holds more than the
    limit plus the shard being written and one waiting; every data file is sent while
    converting (none by the final upload); the objects equal a local conversion's files."""
    url, staging = f"s3://{BUCKET}/{kind}-{name}", tmp_path / "staging"
    watch = Watch(staging_folder(url, staging, {"endpoint_url": proxy.endpoint}), proxy)
    proxy.delay = 0.03  # each request: the upload is the slower side
    proxy.most_in_flight = 0
    try:
        result = convert_to_url(
            sources[kind],
            url,
            storage_options={"endpoint_url": proxy.endpoint},
            staging=staging,
            shard_size=SHARD,
            staging_limit=LIMIT,
            workers=1,
            progress=False,
            on_event=watch,
        )
    finally:
        proxy.delay = 0.0
    local = tmp_path / name
    packer.convert(sources[kind], local, shard_size=SHARD, workers=1, progress=False)
    expected = files(local)
    assert_same_dataset(objects(server, url), expected)
    data = {n: b for n, b in expected.items() if n.rsplit("/", 1)[-1] not in TABLES}
    total, biggest = sum(map(len, data.values())), max(map(len, data.values()))
    assert watch.events >= len(data) >= 6 and total > 8 * LIMIT
    slack = 4096 * 4  # block rounding of a few files
    assert watch.most <= LIMIT + 3 * biggest + slack, (watch.most, LIMIT, biggest, total)
    assert watch.most < total / 2
    note = next(n for n in result.notes if n.startswith("uploaded"))
    assert f"{len(data)} while converting" in note, note


def test_several_shards_go_up_at_once(
    server: S3Server, proxy: FaultProxy, sources: dict[str, Path], tmp_path: Path
) -> None:
    """One PUT at a time used under half of a link (benchmarks/staging_stream.py): with room
    under the limit, shards are sent several at once."""
    url, staging = f"s3://{BUCKET}/together.lmdb", tmp_path / "staging"
    watch = Watch(staging_folder(url, staging, {"endpoint_url": proxy.endpoint}), proxy)
    proxy.delay, proxy.most_in_flight = 0.05, 0
    try:
        convert_to_url(
            sources["images"],
            url,
            storage_options={"endpoint_url": proxy.endpoint},
            staging=staging,
            shard_size=SHARD,
            staging_limit="1MB",
            workers=1,
            progress=False,
            on_event=watch,
        )
    finally:
        proxy.delay = 0.0
    assert watch.streamed_at_once >= 3, watch.streamed_at_once


def test_a_released_object_lost_from_the_store_is_refused_on_resume(
    server: S3Server, proxy: FaultProxy, sources: dict[str, Path], tmp_path: Path
) -> None:
    """A conversion stopped after some shards were sent and released; one of those objects is
    then deleted at the store: ``resume`` refuses, naming it, and sends no released (empty)
    copy; without ``resume`` the conversion starts over and the dataset is whole."""
    url, staging = f"s3://{BUCKET}/lost.lmdb", tmp_path / "staging"
    options = {"endpoint_url": server.endpoint}
    journal = staging_folder(url, staging, options) / "upload-journal.jsonl"

    def stop_once_two_released(name: str, number: int) -> None:
        if name == "shard" and journal.read_text().count('"released": true') >= 2:
            raise KeyboardInterrupt  # as a user's Ctrl-C

    common = dict(storage_options=options, staging=staging, shard_size=SHARD, workers=1)
    with pytest.raises(KeyboardInterrupt):
        convert_to_url(
            sources["images"],
            url,
            staging_limit=1,  # each shard waits for the one before: released in order
            progress=False,
            on_event=stop_once_two_released,
            **common,
        )
    released = [json.loads(line) for line in journal.read_text().splitlines()]
    released = [e["name"] for e in released if e.get("released")]
    assert released and "packer.json" not in objects(server, url)
    server.filesystem().rm_file(f"{url}/{released[0]}")
    with pytest.raises(DestinationError, match=f"{released[0]}.*no longer holds it"):
        convert_to_url(sources["images"], url, resume=True, progress=False, **common)
    assert f"{url}/{released[0]}".split("://")[1] not in server.filesystem().find(url)
    convert_to_url(sources["images"], url, progress=False, **common)
    local = tmp_path / "local.lmdb"
    packer.convert(sources["images"], local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))


def test_overwrite_deletes_the_old_manifest_before_the_first_shard_is_sent(
    server: S3Server, proxy: FaultProxy, sources: dict[str, Path], tmp_path: Path
) -> None:
    """Over an existing dataset, the old ``packer.json`` goes before any object of the new one
    (no reader opens the old dataset while its shards are replaced); a conversion that fails
    before its first shard is finished leaves the old dataset whole and readable."""
    url, staging = f"s3://{BUCKET}/again.lmdb", tmp_path / "staging"
    common = dict(staging=staging, shard_size=SHARD, workers=1, progress=False)
    first = dict(storage_options={"endpoint_url": server.endpoint}, **common)
    convert_to_url(sources["images"], url, **first)
    old = objects(server, url)

    def fail_at_first_sample(name: str, number: int) -> None:
        if name == "sample":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_to_url(
            sources["frames"], url, overwrite=True, on_event=fail_at_first_sample, **first
        )
    assert objects(server, url) == old
    assert len(packer.open_dataset(url, storage_options={"endpoint_url": server.endpoint})) == 40
    proxy.served.clear()
    through = dict(storage_options={"endpoint_url": proxy.endpoint}, **common)
    convert_to_url(sources["frames"], url, overwrite=True, **through)
    sent = [r for r in proxy.served if r.startswith(("PUT", "DELETE", "POST"))]
    top = next(i for i, r in enumerate(sent) if f"/{BUCKET}/again.lmdb/packer.json" in r)
    first_put = next(i for i, r in enumerate(sent) if r.startswith("PUT"))
    assert sent[top].startswith("DELETE") and top < first_put, sent[:6]
    local = tmp_path / "frames.lmdb"
    packer.convert(sources["frames"], local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))


def test_an_executor_writes_ahead_of_the_upload_by_a_window_only(
    server: S3Server, proxy: FaultProxy, sources: dict[str, Path], tmp_path: Path
) -> None:
    """With an executor (``--dask``; here a pool of two real worker processes) the shards are
    sent as they complete, in the converting process, and at most twice the pool's slots are
    written ahead: staging stays under half the output; the objects equal a local
    conversion's (the stream's ``on_event`` pickles to the tasks as the caller's alone)."""
    from concurrent.futures import ProcessPoolExecutor

    url, staging = f"s3://{BUCKET}/pool.bmp", tmp_path / "staging"
    proxy.delay = 0.03
    try:
        with (
            ProcessPoolExecutor(2) as pool,
            Poll(staging_folder(url, staging, {"endpoint_url": proxy.endpoint})) as watch,
        ):
            result = convert_to_url(
                sources["images"],
                url,
                storage_options={"endpoint_url": proxy.endpoint},
                staging=staging,
                shard_size=SHARD,
                staging_limit=LIMIT,
                executor=pool,
                progress=False,
            )
    finally:
        proxy.delay = 0.0
    local = tmp_path / "local.bmp"
    packer.convert(sources["images"], local, shard_size=SHARD, workers=1, progress=False)
    expected = files(local)
    assert_same_dataset(objects(server, url), expected)
    data = {n: b for n, b in expected.items() if n.rsplit("/", 1)[-1] not in TABLES}
    total, biggest = sum(map(len, data.values())), max(map(len, data.values()))
    shard = 3 * biggest  # a planned shard of SHARD source bytes: 2-3 images
    assert watch.events > 100 and watch.most <= LIMIT + (2 * 2 + 1) * shard, (watch.most, total)
    assert watch.most < total / 2, (watch.most, total)
    note = next(n for n in result.notes if n.startswith("uploaded"))
    assert f"{len(data)} while converting" in note, note


def test_a_part_that_finds_another_parts_shards_takes_them_as_ours(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    """Two real ``--part`` processes on one URL: part 1 reads the journal, then its check of the
    store is held while part 0 runs whole, sending its shards (no manifest). Part 1's check then
    finds them: it reads the journal again, sees the upload is this staging folder's, and goes
    on instead of refusing a foreign prefix; ``merge`` uploads the tables and manifest, and the
    dataset equals one run's."""
    url, staging = f"s3://{BUCKET}/parts.lmdb", tmp_path / "staging"
    env = {**os.environ, "PYTHONPATH": str(Path(packer.__file__).parents[1])}
    with holding_proxy(server.endpoint) as proxy:
        common = ["--staging", str(staging), "--storage-option", f"endpoint_url={proxy.endpoint}"]
        given = [*common, "--shard-size", str(SHARD), "--workers", "1", "-q"]

        def part(i: int) -> subprocess.Popen[str]:
            command = [sys.executable, "-m", "packer", "convert", str(sources["images"]), url]
            command += ["--part", f"{i}/2", *given]
            return subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)

        proxy.hold = "list-type=2&prefix=parts.lmdb"
        second = part(1)
        deadline = time.monotonic() + 300  # a hang guard, not a bound
        while not proxy.held:  # part 1 has read the journal and asks the store
            assert second.poll() is None and time.monotonic() < deadline, second.stderr
            time.sleep(0.02)
        proxy.hold = ""  # part 0 passes
        first = part(0)
        assert first.wait(120) == 0, first.communicate()[1]
        assert objects(server, url)  # part 0's shards, no manifest
        proxy.released.set()  # part 1's held listing fails (503), its retry sees them
        assert second.wait(120) == 0, second.communicate()[1]
        merged = CliRunner().invoke(main, ["merge", url, *common])
    assert merged.exit_code == 0, merged.output
    local = tmp_path / "local.lmdb"
    packer.convert(sources["images"], local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))


def test_a_shard_written_again_after_its_copy_was_released_is_sent(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    """The journal's "released" mark holds only for the released copy itself: a part staged
    again whole (``keep_staging``) after a streamed one was merged rewrites its shard files, and
    the next ``merge`` sends one the store lost instead of refusing it as released (the others,
    held as sent from the bytes the manifest records, are kept)."""
    url, staging = f"s3://{BUCKET}/again-parts.lmdb", tmp_path / "staging"
    common = dict(staging=staging, storage_options={"endpoint_url": server.endpoint})
    args = dict(shard_size=SHARD, workers=1, progress=False, part=(0, 1), **common)
    convert_to_url(sources["images"], url, **args)  # streamed: the shards sent, copies released
    merge_to_url(url, keep_staging=True, progress=False, **common)  # the journal stays
    journal = staging_folder(url, staging, common["storage_options"]) / "upload-journal.jsonl"
    assert '"released": true' in journal.read_text()
    convert_to_url(sources["images"], url, overwrite=True, keep_staging=True, **args)
    server.filesystem().rm_file(f"{url}/shard-00000.mdb")
    merged = merge_to_url(url, overwrite=True, progress=False, **common)
    assert "uploaded 5 object(s)" in " ".join(merged.notes), merged.notes  # the lost one too
    local = tmp_path / "local.lmdb"
    packer.convert(sources["images"], local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))
