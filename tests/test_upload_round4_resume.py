"""Issue 40 item 7: the manifest reached the store but not the journal, and ``--resume`` (the
advice of the error) finishes the upload instead of refusing packer's own dataset as "already
holds a packer dataset". Two routes, through a fault-injecting proxy in front of a real S3
server (moto on the loopback):

- every HEAD of the uploaded ``packer.json`` answered 503: the upload fails saying
  "run ... again with --resume";
- the process killed (SIGKILL) after the manifest's PUT, while its HEAD is held back: the
  journal never gets the manifest's line.

Either way the resumed run exits 0 and the dataset at the URL equals a local conversion.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from fault_proxy import FaultProxy
from s3_server import S3Server
from test_remote_write import assert_same_dataset, files, objects

import packer
from packer.cli.app import main
from packer.demo.image import make_image_tree
from packer.errors import DestinationError
from packer.remote import storage
from packer.upload.staging import convert_to_url

BUCKET = "round4-resume"
SHARD = "4kB"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume_src")
    return make_image_tree(root / "images", classes=2, per_class=6, size=(64, 48), bad=0).root


def resume(source: Path, url: str, proxy: FaultProxy, staging: Path) -> None:
    """``packer convert ... --resume`` through the proxy: it must finish."""
    args = ["convert", str(source), url, "--resume", "--staging", str(staging), "-q"]
    args += ["--storage-option", f"endpoint_url={proxy.endpoint}"]
    result = CliRunner().invoke(main, [*args, "--shard-size", SHARD, "--workers", "1"])
    assert result.exit_code == 0, result.output


def same_as_local(server: S3Server, url: str, source: Path, tmp_path: Path) -> None:
    local = tmp_path / ("local" + url[url.rindex(".") :])
    packer.convert(source, local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))


def test_a_manifest_whose_head_failed_is_finished_by_resume(
    server: S3Server,
    proxy: FaultProxy,
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, staging = f"s3://{BUCKET}/head.lmdb", tmp_path / "staging"
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01))
    proxy.inject(["503"] * 8, match=f"HEAD /{BUCKET}/head.lmdb/packer.json")
    try:
        with pytest.raises(DestinationError, match="--resume"):
            convert_to_url(
                source,
                url,
                storage_options={"endpoint_url": proxy.endpoint},
                staging=staging,
                shard_size=SHARD,
                workers=1,
                progress=False,
            )
    finally:
        proxy.inject([])
    assert "packer.json" in objects(server, url), "the manifest's PUT went through"
    resume(source, url, proxy, staging)
    same_as_local(server, url, source, tmp_path)


def test_a_kill_between_the_manifest_put_and_its_journal_line_is_finished_by_resume(
    server: S3Server, proxy: FaultProxy, source: Path, tmp_path: Path
) -> None:
    url, staging = f"s3://{BUCKET}/killed.npy", tmp_path / "staging"
    head = f"HEAD /{BUCKET}/killed.npy/packer.json"
    proxy.inject(["slow"], match=head)  # the HEAD after the manifest's PUT waits: kill then
    args = ["convert", str(source), url, "--staging", str(staging), "-q"]
    args += ["--storage-option", f"endpoint_url={proxy.endpoint}", "--shard-size", SHARD]
    child = subprocess.Popen([sys.executable, "-m", "packer", *args, "--workers", "1"])
    try:
        deadline = time.monotonic() + 120
        while not any(s.startswith(head) for s in proxy.served):
            assert child.poll() is None and time.monotonic() < deadline, "no manifest HEAD"
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(30)
        proxy.inject([])
    assert child.returncode == -signal.SIGKILL
    journal = next(staging.glob("*/upload-journal.jsonl")).read_text()
    assert '"sending": "packer.json"' in journal and '"name": "packer.json"' not in journal
    assert "packer.json" in objects(server, url), "the manifest's PUT went through"
    resume(source, url, proxy, staging)
    same_as_local(server, url, source, tmp_path)


def test_a_manifest_replaced_since_is_still_refused(
    server: S3Server,
    proxy: FaultProxy,
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same failed HEAD, then someone replaces ``packer.json`` with other bytes of the same
    size: it is not this upload's, and ``--resume`` refuses it."""
    url, staging = f"s3://{BUCKET}/replaced.lmdb", tmp_path / "staging"
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01))
    proxy.inject(["503"] * 8, match=f"HEAD /{BUCKET}/replaced.lmdb/packer.json")
    options = {"endpoint_url": proxy.endpoint}
    common = dict(storage_options=options, staging=staging, shard_size=SHARD, workers=1)
    try:
        with pytest.raises(DestinationError, match="--resume"):
            convert_to_url(source, url, progress=False, **common)
    finally:
        proxy.inject([])
    fs = server.filesystem()
    ours = fs.cat_file(f"{url}/packer.json")
    theirs = ours.replace(b'"created": "2', b'"created": "1')
    assert theirs != ours and len(theirs) == len(ours)
    fs.pipe_file(f"{url}/packer.json", theirs)
    with pytest.raises(DestinationError, match="already holds a packer dataset"):
        convert_to_url(source, url, progress=False, resume=True, **common)
    assert fs.cat_file(f"{url}/packer.json") == theirs
