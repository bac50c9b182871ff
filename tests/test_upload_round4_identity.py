"""Issue 40 items 2, 8 and 10: the staging folder of an upload belongs to the store the client
really reaches, and to nothing else.

- A run killed on store A, then a plain run to the same URL that a profile (``AWS_PROFILE``)
  or fsspec's configuration (``FSSPEC_S3_ENDPOINT_URL``) sends to store B: B's objects are
  neither overwritten nor deleted "as stale" (the run is refused: B holds objects packer did
  not write there).
- ``--resume --storage-option read_timeout=120`` (the change packer's own timeout message
  suggests), or any other packer-only option, continues the killed run.
- One store spelled two ways (``http://127.0.0.1:PORT`` and ``http://localhost:PORT/``) is one
  staging folder: a resume through the other spelling continues the run, a second writer
  through it is refused as a second writer, not blamed on the store.

Two real S3 servers: moto in this process (A) and moto's server in a subprocess (B; moto keeps
its state per process, so that one is another store).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from s3_server import S3Server
from test_remote_write import assert_same_dataset, files, objects

import packer
from packer.cli.app import main
from packer.demo.image import make_image_tree
from packer.errors import DestinationError
from packer.upload.staging import convert_to_url, staging_folder

BUCKET = "round4"
SHARD = "4kB"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("round4_src")
    return make_image_tree(root / "images", classes=2, per_class=8, size=(64, 48), bad=0).root


@pytest.fixture(scope="module")
def store_b(server: S3Server) -> Iterator[S3Server]:
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


def killed(src: Path, url: str, options: dict[str, Any], staging: Path) -> None:
    """An upload to ``url`` (the store ``options`` and the environment reach) stopped after
    two shards were sent and released."""
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


def plant_like(store: S3Server, url: str, names: list[str]) -> dict[str, bytes]:
    """At ``store``, objects of someone else under ``url`` named as ``names``."""
    theirs = {name: b"store B's own " + name.encode() for name in names}
    fs = store.filesystem()
    for name, data in theirs.items():
        fs.pipe_file(f"{url}/{name}", data)
    return theirs


def profiles(tmp_path: Path, a: S3Server, b: S3Server) -> Path:
    config = tmp_path / "aws-config"
    config.write_text(
        f"[profile pa]\nendpoint_url = {a.endpoint}\n\n[profile pb]\nendpoint_url = {b.endpoint}\n"
    )
    return config


@pytest.mark.parametrize("route", ["AWS_PROFILE", "AWS_ENDPOINT_URL"])
def test_a_profile_on_another_store_never_touches_its_objects(
    server: S3Server,
    store_b: S3Server,
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    route: str,
) -> None:
    """Store A, then store B, chosen by the profile (``AWS_PROFILE`` in ``AWS_CONFIG_FILE``)
    or by botocore's ``AWS_ENDPOINT_URL``; no storage option names either."""
    url, staging = f"s3://{BUCKET}/{route}.lmdb", tmp_path / "staging"
    monkeypatch.setenv("AWS_CONFIG_FILE", str(profiles(tmp_path, server, store_b)))
    use = {"AWS_PROFILE": ("pa", "pb"), "AWS_ENDPOINT_URL": (server.endpoint, store_b.endpoint)}
    monkeypatch.setenv(route, use[route][0])
    killed(source, url, {}, staging)
    sent = sorted(objects(server, url))
    assert len(sent) >= 2, "some shards were sent to A"
    theirs = plant_like(store_b, url, sent)  # B holds objects named as A's journal knows
    monkeypatch.setenv(route, use[route][1])
    with pytest.raises(DestinationError, match="packer did not write"):
        convert_to_url(source, url, staging=staging, workers=1, progress=False)
    assert objects(store_b, url) == theirs  # none overwritten, none deleted as stale
    assert sorted(objects(server, url)) == sent


def test_an_fsspec_config_on_another_store_never_touches_its_objects(
    server: S3Server,
    store_b: S3Server,
    source: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Store A through fsspec's configuration (what ``FSSPEC_S3_ENDPOINT_URL`` sets when fsspec
    is imported), then a plain ``packer convert`` in a new process with
    ``FSSPEC_S3_ENDPOINT_URL`` naming store B."""
    import fsspec.config

    url, staging = f"s3://{BUCKET}/fsspec.lmdb", tmp_path / "staging"
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": server.endpoint})
    killed(source, url, {}, staging)
    theirs = plant_like(store_b, url, sorted(objects(server, url)))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_PROFILE", "FSSPEC"))}
    env["FSSPEC_S3_ENDPOINT_URL"] = store_b.endpoint
    args = ["convert", str(source), url, "--staging", str(staging), "--workers", "1", "-q"]
    done = subprocess.run(
        [sys.executable, "-m", "packer", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode != 0 and "packer did not write" in done.stderr, done.stderr
    assert objects(store_b, url) == theirs


@pytest.mark.parametrize(
    "extra",
    [
        ["read_timeout=120"],
        ["connect_timeout=5", "min_rate=16kB", "backend=fsspec"],
    ],
)
def test_resume_with_packer_only_options_continues_the_killed_run(
    server: S3Server, source: Path, tmp_path: Path, extra: list[str]
) -> None:
    url, staging = f"s3://{BUCKET}/timeout-{len(extra)}.npy", tmp_path / "staging"
    killed(source, url, {"endpoint_url": server.endpoint}, staging)
    options = [f"endpoint_url={server.endpoint}", *extra]
    args = ["convert", str(source), url, "--resume", "--staging", str(staging), "-q"]
    args += ["--shard-size", SHARD, "--workers", "1"]
    for option in options:
        args += ["--storage-option", option]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    local = tmp_path / "local.npy"
    packer.convert(source, local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))


def _spellings(server: S3Server) -> tuple[str, str]:
    port = server.endpoint.rsplit(":", 1)[1]
    return f"http://127.0.0.1:{port}", f"http://LOCALHOST:{port}/"


def test_one_store_spelled_two_ways_is_one_staging_folder(
    server: S3Server, source: Path, tmp_path: Path
) -> None:
    url, staging = f"s3://{BUCKET}/spelled.lmdb", tmp_path / "staging"
    first, second = _spellings(server)
    killed(source, url, {"endpoint_url": first}, staging)
    result = convert_to_url(
        source,
        url,
        storage_options={"endpoint_url": second},
        staging=staging,
        resume=True,
        shard_size=SHARD,
        workers=1,
        progress=False,
    )
    assert "resumed" in " ".join(result.notes)
    local = tmp_path / "local.lmdb"
    packer.convert(source, local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))


def test_a_second_writer_through_another_spelling_is_refused_as_a_second_writer(
    server: S3Server, source: Path, tmp_path: Path
) -> None:
    url, staging = f"s3://{BUCKET}/two-writers.npy", tmp_path / "staging"
    first, second = _spellings(server)
    holding, go = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold(name: str, number: int) -> None:
        if name == "shard":
            holding.set()
            go.wait(300)  # a hang guard: the test lets it go

    def writer() -> None:
        try:
            convert_to_url(
                source,
                url,
                storage_options={"endpoint_url": first},
                staging=staging,
                shard_size=SHARD,
                workers=1,
                progress=False,
                on_event=hold,
            )
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert holding.wait(300)  # a hang guard, not a bound
        with pytest.raises(DestinationError, match="being written by another packer process"):
            convert_to_url(
                source,
                url,
                storage_options={"endpoint_url": second},
                staging=staging,
                progress=False,
            )
    finally:
        go.set()
        thread.join(120)
    assert not failures, failures
    assert len(packer.open_dataset(url, storage_options={"endpoint_url": second})) == 16


@pytest.mark.parametrize(
    ("one", "other", "same"),
    [
        ("http://127.0.0.1:9000", "http://LOCALHOST:9000/", True),
        ("http://[::1]:9000", "http://localhost:9000", True),
        ("https://minio.example.com:443/", "HTTPS://Minio.Example.com", True),
        ("http://minio.example.com:80", "http://minio.example.com", True),
        ("https://s3.amazonaws.com", "https://s3.eu-west-1.amazonaws.com", True),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9001", False),
        ("http://minio:9000", "https://minio:9000", False),
        ("https://s3.amazonaws.com", "https://s3.cn-north-1.amazonaws.com.cn", False),
        ("https://s3.us-gov-west-1.amazonaws.com", "https://s3.amazonaws.com", False),
        ("http://host:9000/a", "http://host:9000/b", False),
    ],
)
def test_an_endpoint_is_written_one_way(one: str, other: str, same: bool) -> None:
    from packer.upload.identity import normal_endpoint

    assert (normal_endpoint(one) == normal_endpoint(other)) is same
