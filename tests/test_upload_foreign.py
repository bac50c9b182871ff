"""An upload deletes only what packer wrote (issue 28, findings 2 and 3).

- The staging folder is keyed by the URL *and* the store (endpoint and other options): a killed
  upload to ``s3://b/x.npy`` on one store never lets a run to the same URL on another store
  adopt its journal, write into a prefix of someone else's objects and delete them as stale.
- A prefix without a manifest that holds objects packer did not write is refused, even when
  this staging folder's own interrupted upload is there too.
- ``--overwrite`` deletes exactly the old dataset's objects (what its manifests list), never a
  user's ``notes/README.txt`` or ``checkpoints/model.pt`` inside the prefix.

Two real S3 servers: moto in this process and a second moto server in a subprocess (moto keeps
its state per process, so that one is another store).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server
from test_remote_write import assert_same_dataset, files, objects

import packer
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.errors import DestinationError
from packer.upload.staging import convert_to_url, staging_folder

BUCKET = "foreign"
SHARD = "4kB"
USER = {"notes/README.txt": b"my notes\n", "checkpoints/model.pt": b"weights" * 100}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("foreign_src")
    images = make_image_tree(root / "images", classes=2, per_class=8, size=(64, 48), bad=0)
    frames = make_video_tree(root / "frames", classes=2, per_class=2)
    return {"images": images.root, "frames": frames.root}


@pytest.fixture(scope="module")
def other_store(server: S3Server) -> Iterator[S3Server]:
    """A second, separate S3 store: moto's server in a subprocess on another port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300  # a hang guard: moto starts at its own pace
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert child.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.1)
        other = S3Server(f"http://127.0.0.1:{port}", BUCKET)
        other.filesystem().mkdir(BUCKET)
        yield other
    finally:
        child.terminate()
        child.wait(30)


def plant(store: S3Server, url: str, objects_: dict[str, bytes]) -> None:
    fs = store.filesystem()
    for name, data in objects_.items():
        fs.pipe_file(f"{url}/{name}", data)


def interrupted(src: Path, url: str, store: S3Server, staging: Path) -> None:
    """An upload to ``url`` at ``store`` stopped after two shards were sent."""
    options = {"endpoint_url": store.endpoint}
    journal = staging_folder(url, staging, options) / "upload-journal.jsonl"

    def stop(name: str, number: int) -> None:
        if name == "shard" and journal.read_text().count('"released": true') >= 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert_to_url(
            src,
            url,
            storage_options=options,
            staging=staging,
            shard_size=SHARD,
            workers=1,
            staging_limit=1,
            progress=False,
            on_event=stop,
        )
    assert objects(store, url), "some shards were sent"


def test_a_run_on_another_store_never_adopts_the_journal_or_deletes_its_objects(
    server: S3Server, other_store: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    url, staging = f"s3://{BUCKET}/x.npy", tmp_path / "staging"
    interrupted(sources["images"], url, server, staging)
    theirs = {"shard-00000.npy": b"someone else's data", **USER}
    plant(other_store, url, theirs)
    options = {"endpoint_url": other_store.endpoint}
    with pytest.raises(DestinationError, match="packer did not write"):
        convert_to_url(
            sources["images"], url, storage_options=options, staging=staging, progress=False
        )
    assert objects(other_store, url) == theirs
    assert staging_folder(url, staging, options) != staging_folder(
        url, staging, {"endpoint_url": server.endpoint}
    )


@pytest.mark.parametrize("resume", [False, True])
def test_a_foreign_object_beside_our_interrupted_upload_is_refused(
    server: S3Server, sources: dict[str, Path], tmp_path: Path, resume: bool
) -> None:
    url, staging = f"s3://{BUCKET}/beside-{resume}.lmdb", tmp_path / "staging"
    interrupted(sources["images"], url, server, staging)
    plant(server, url, USER)
    before = objects(server, url)
    options = {"endpoint_url": server.endpoint}
    with pytest.raises(DestinationError, match="notes/README.txt|checkpoints/model.pt"):
        convert_to_url(
            sources["images"],
            url,
            storage_options=options,
            staging=staging,
            shard_size=SHARD,
            workers=1,
            resume=resume,
            progress=False,
        )
    assert objects(server, url) == before


@pytest.mark.parametrize("name", ["over.lmdb", "over.bmp"])
def test_overwrite_deletes_only_what_the_old_manifest_lists(
    server: S3Server, sources: dict[str, Path], tmp_path: Path, name: str
) -> None:
    url, options = f"s3://{BUCKET}/{name}", {"endpoint_url": server.endpoint}
    common = dict(storage_options=options, shard_size=SHARD, workers=1, progress=False)
    convert_to_url(sources["images"], url, staging=tmp_path / "one", **common)
    plant(server, url, USER)
    convert_to_url(sources["frames"], url, overwrite=True, staging=tmp_path / "two", **common)
    local = tmp_path / name
    packer.convert(sources["frames"], local, shard_size=SHARD, workers=1, progress=False)
    found = objects(server, url)
    for user_name, data in USER.items():
        assert found.pop(user_name) == data
    assert_same_dataset(found, files(local))  # the old images' objects all deleted
    assert len(packer.open_dataset(url, storage_options=options)) == 4


def test_a_refused_command_leaves_no_staging_folder(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    url, staging = f"s3://{BUCKET}/refused.npy", tmp_path / "staging"
    common = dict(storage_options={"endpoint_url": server.endpoint}, progress=False)
    convert_to_url(sources["images"], url, staging=tmp_path / "first", **common)
    with pytest.raises(DestinationError, match="already holds a packer dataset"):
        convert_to_url(sources["images"], url, staging=staging, **common)
    assert list(staging.iterdir()) == []


def test_an_unreachable_store_says_nothing_was_written_not_resume(
    sources: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packer.remote import storage

    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there
    options = {"endpoint_url": closed}
    with pytest.raises(DestinationError) as refused:
        convert_to_url(
            sources["images"],
            f"s3://{BUCKET}/nowhere.lmdb",
            storage_options=options,
            staging=tmp_path / "staging",
            progress=False,
        )
    assert "nothing was written" in str(refused.value) and "--resume" not in str(refused.value)
    assert "endpoint_url" in str(refused.value)


def test_resume_of_a_finished_upload_says_complete_as_locally(
    server: S3Server, sources: dict[str, Path], tmp_path: Path
) -> None:
    """``--resume`` after the upload finished (its staging folder gone) exits 0 saying the
    dataset is complete, as a local ``--resume`` of a published output does; with another
    source or options it is refused saying what differs, and a plain run still needs
    --overwrite."""
    from click.testing import CliRunner

    from packer.cli.app import main

    url, staging = f"s3://{BUCKET}/finished.npy", tmp_path / "staging"
    base = ["convert", "--staging", str(staging), "--workers", "1", "--shard-size", SHARD]
    base += ["--storage-option", f"endpoint_url={server.endpoint}", "-q"]
    first = CliRunner().invoke(main, [*base, str(sources["images"]), url])
    assert first.exit_code == 0, first.output
    before = objects(server, url)
    again = CliRunner().invoke(main, [*base, str(sources["images"]), url, "--resume"])
    assert again.exit_code == 0, again.output
    assert "already complete" in again.output
    other = CliRunner().invoke(main, [*base, str(sources["frames"]), url, "--resume"])
    assert other.exit_code == 1 and "nothing to resume" in other.output, other.output
    bigger = [*base, str(sources["images"]), url, "--resume", "--max-pixels", "5"]
    changed = CliRunner().invoke(main, bigger)
    assert changed.exit_code == 1 and "max_pixels" in changed.output, changed.output
    plain = CliRunner().invoke(main, [*base, str(sources["images"]), url])
    assert plain.exit_code == 1 and "--overwrite" in plain.output
    assert objects(server, url) == before
    assert list(staging.iterdir()) == []
