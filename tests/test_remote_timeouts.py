"""Issue 28, item 4: a store that accepts and never answers, or answers a byte every so often,
never hangs an open, a read or an upload: every request has a connect and a read timeout and
every attempt a bound that scales with its bytes (``connect_timeout + read_timeout + bytes /
min_rate``), set by the storage options a user sets (``--storage-option read_timeout=...``).
Real sockets: moto behind :mod:`stall_relay`, over s3:// and plain http(s)://, through fsspec
and obstore."""

from __future__ import annotations

import functools
import json
import shutil
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fault_proxy import FaultProxy
from s3_server import S3Server
from stall_relay import StallRelay, stall_relay

import packer
from packer.cli.app import main
from packer.demo.image import make_image_tree
from packer.errors import FormatError, PackerError
from packer.remote import storage

BUCKET = "timeouts"
QUICK = {"connect_timeout": 1, "read_timeout": 1, "min_rate": 2_000_000}
ATTEMPTS = 2
# an attempt's bound: connect + read + bytes / min_rate (an unknown size counts as 4 MB)
PER_ATTEMPT = 1 + 1 + (4 << 20) / QUICK["min_rate"]
# A hang guard, not the assertion: the attempts' count is in the error and the relay's log;
# a read without its bound (a trickle of a byte every 50 ms) would go on far past this
HANG = 300.0


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=ATTEMPTS, base=0.01, cap=0.02))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("timeouts_src")
    return make_image_tree(root / "images", classes=2, per_class=3, size=(64, 48), bad=0).root


@pytest.fixture(scope="module")
def local(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("timeouts") / "images.npy"
    packer.convert(source, out, shard_size="8kB", workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def relay(server: S3Server, local: Path) -> Iterator[StallRelay]:
    server.upload(local, "images.npy")
    fs = server.filesystem()
    for key in fs.find(f"{BUCKET}/images.npy"):
        fs.chmod(key, "public-read")  # readable over plain http too
    with stall_relay(server.endpoint, life=600) as running:
        yield running


@pytest.fixture
def stall(relay: StallRelay) -> Iterator[StallRelay]:
    relay.mode, relay.match = "pass", ""
    yield relay
    relay.mode, relay.match = "pass", ""


def _where(relay: StallRelay, scheme: str, backend: str) -> tuple[str, dict[str, Any]]:
    options: dict[str, Any] = {**QUICK, "backend": backend}
    if scheme == "http":
        return f"{relay.endpoint}/{BUCKET}/images.npy", options
    return f"s3://{BUCKET}/images.npy", {**options, "endpoint_url": relay.endpoint}


def _ends(call: Any) -> Any:
    """``call()`` in a thread: its result, or the exception it raised; a call still running
    after :data:`HANG` seconds fails the test (a hang guard: the bounds are asserted by counts)."""
    ended: list[Any] = []

    def target() -> None:
        try:
            ended.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            ended.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HANG)
    assert not thread.is_alive(), f"still running after {HANG:.0f} s: a hang"
    return ended[0]


def _fails_in_time(call: Any, error: type[Exception] = PackerError) -> str:
    raised = _ends(call)
    assert isinstance(raised, error), raised
    return str(raised)


@pytest.mark.parametrize("mode", ["silent", "trickle"])
@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_open_ends_in_a_bounded_clear_error(stall: StallRelay, scheme: str, mode: str) -> None:
    url, options = _where(stall, scheme, "fsspec")
    stall.mode, stall.match = mode, "packer.json"
    text = _fails_in_time(lambda: packer.open_dataset(url, storage_options=options))
    assert f"{ATTEMPTS} attempts" in text and "read_timeout=" in text, text
    assert "--storage-option read_timeout=" in text, text


@pytest.mark.parametrize("mode", ["silent", "trickle"])
@pytest.mark.parametrize("backend", ["fsspec", "obstore"])
@pytest.mark.parametrize("scheme", ["http", "s3"])
def test_read_ends_in_a_bounded_clear_error(
    stall: StallRelay, local: Path, scheme: str, backend: str, mode: str
) -> None:
    url, options = _where(stall, scheme, backend)
    remote = packer.open_dataset(url, output="bytes", storage_options=options)
    assert remote[0] == packer.open_dataset(local, output="bytes")[0]  # a working link reads
    stall.mode, stall.match = mode, "GET /timeouts/images.npy/shard"
    text = _fails_in_time(lambda: remote[1])
    assert f"{ATTEMPTS} attempts" in text and "read_timeout=" in text, text


def test_a_slow_answer_within_the_bounds_is_read(stall: StallRelay, local: Path) -> None:
    """A trickle that ends within an attempt's bound is a slow link, not a failure."""
    url, options = _where(stall, "s3", "fsspec")
    remote = packer.open_dataset(url, output="bytes", storage_options={**options, "min_rate": 10})
    stall.mode, stall.match, stall.every = "trickle", "GET /timeouts/images.npy/shard", 0.0005
    try:
        assert remote[1] == packer.open_dataset(local, output="bytes")[1]
    finally:
        stall.every = 0.05


def test_upload_to_a_store_that_never_answers(
    stall: StallRelay, source: Path, tmp_path: Path
) -> None:
    """A PUT whose answer (its ``100 Continue`` too) never comes is cancelled at its bound,
    tried again, then a clear error: never a hang."""
    stall.mode, stall.match = "silent", "PUT "
    options = [f"endpoint_url={stall.endpoint}", *(f"{k}={v}" for k, v in QUICK.items())]
    args = ["convert", str(source), f"s3://{BUCKET}/up.npy", "--workers", "1", "-q"]
    args += ["--staging", str(tmp_path / "staging")]
    for option in options:
        args += ["--storage-option", option]
    done = _ends(lambda: CliRunner().invoke(main, args))
    assert done.exit_code != 0 and isinstance(done.exception, SystemExit), done.output
    assert "cannot upload to" in done.output and f"{ATTEMPTS} attempts" in done.output
    assert "--storage-option read_timeout=" in done.output, done.output
    assert any(line.startswith("PUT ") for line in stall.requests)


def test_bad_bounds_are_refused_at_once() -> None:
    with pytest.raises(PackerError, match=r"storage option read_timeout is 'soon'.*above 0"):
        packer.open_dataset("s3://b/x.npy", storage_options={"read_timeout": "soon"})
    with pytest.raises(PackerError, match=r"--storage-option min_rate=NUMBER"):
        packer.open_dataset("s3://b/x.npy", storage_options={"min_rate": 0})


def test_bounds_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.remote.obstore_backend import bounds, fsspec_options

    monkeypatch.setenv("PACKER_READ_TIMEOUT", "7")
    assert bounds({})["read_timeout"] == 7.0
    assert bounds({"read_timeout": 3})["read_timeout"] == 3.0  # an option wins
    s3 = fsspec_options("s3", {"read_timeout": 3})
    assert s3["config_kwargs"]["read_timeout"] == 3.0 and "read_timeout" not in s3
    http = fsspec_options("http", {})["client_kwargs"]["timeout"]
    assert (http.total, http.sock_read, http.sock_connect) == (None, 7.0, 10.0)


@pytest.mark.parametrize("name", ["../other/x.npy", "%2e%2e/other/x.npy", "a/%2E%2e/%2e%2e/x.npy"])
def test_crafted_shard_names_send_no_request_outside_the_prefix(
    stall: StallRelay, server: S3Server, local: Path, tmp_path: Path, name: str
) -> None:
    """Issue 28, item 9: an HTTP client resolves ``..`` and ``%2e%2e`` before any check could
    see them; the names are checked before any request leaves."""
    crafted = tmp_path / "crafted.npy"
    shutil.copytree(local, crafted)
    manifest = json.loads((crafted / "packer.json").read_text())
    manifest["shards"][0]["name"] = name
    (crafted / "packer.json").write_text(json.dumps(manifest))
    server.upload(crafted, "crafted.npy")
    fs = server.filesystem()
    for key in fs.find(f"{BUCKET}/crafted.npy"):
        fs.chmod(key, "public-read")
    stall.requests.clear()
    url = f"{stall.endpoint}/{BUCKET}/crafted.npy"
    for cache in (None, str(tmp_path / "cache")):
        with pytest.raises(FormatError, match="not a plain relative name"):
            dataset = packer.open_dataset(url, output="bytes", cache_dir=cache)
            dataset[0]
    outside = [r for r in stall.requests if "/crafted.npy/" not in r.split()[1]]
    assert all(r.split()[1].endswith("/crafted.npy/packer.json") for r in stall.requests)
    assert outside == [], outside


@pytest.mark.parametrize(
    ("fault", "name"), [("short", "packer.json"), ("flip", "index.npy"), ("short", "records.npy")]
)
def test_a_manifest_or_table_damaged_on_the_way_is_fetched_again(
    relay: StallRelay, proxy: FaultProxy, local: Path, fault: str, name: str
) -> None:
    """Issue 28, item 8: over plain http nothing checks a body; a cut or flipped manifest or
    table is fetched again before the dataset is called damaged."""
    url = f"{proxy.endpoint}/{BUCKET}/images.npy"
    options = {"backend": "fsspec"}
    proxy.inject([fault], match=f"GET /{BUCKET}/images.npy/{name}")
    remote = packer.open_dataset(url, output="bytes", storage_options=options)
    assert proxy.faults == []  # the fault was served, then the object fetched again
    assert remote[0] == packer.open_dataset(local, output="bytes")[0]
    proxy.inject([fault] * ATTEMPTS, match=f"GET /{BUCKET}/images.npy/{name}")
    with pytest.raises(FormatError, match=f"the same in {ATTEMPTS} fetches"):
        packer.open_dataset(url, output="bytes", storage_options=options)
    proxy.inject([])


def test_a_mistyped_storage_option_is_named(
    stall: StallRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28, item 13: s3fs swallows an unknown option and the network then fails; packer
    names it, the option meant and the known ones, at once: no request is tried (any would
    reach the relay, the environment's endpoint)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", stall.endpoint)
    stall.requests.clear()
    options = {"endpoint": "http://127.0.0.1:9"}
    with pytest.raises(PackerError, match=r"'endpoint' is unknown.*did you mean endpoint_url"):
        packer.open_dataset(f"s3://{BUCKET}/images.npy", storage_options=options)
    assert stall.requests == []  # no request was tried
    done = CliRunner().invoke(main, ["inspect", "s3://b/x.npy", "--storage-option", "endpoint=x"])
    assert "did you mean endpoint_url" in done.output and "--storage-option KEY=VALUE" in (
        done.output
    ), done.output


@pytest.mark.parametrize("backend", ["fsspec", "obstore"])
def test_a_server_without_range_requests_is_named_once(local: Path, backend: str) -> None:
    """Issue 28, item 13: a plain HTTP server that ignores Range (Python's http.server) gets one
    line saying so, after the retries (a proxy may have ignored it once)."""

    class Plain(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Plain, directory=str(local.parent))
    served = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{served.server_address[1]}/{local.name}"
        remote = packer.open_dataset(url, output="bytes", storage_options={"backend": backend})
        with pytest.raises(PackerError) as caught:
            remote[3]
        text = str(caught.value)
        assert text.count("must support Range requests") == 1 and "\n" not in text, text
        assert "unreachable" not in text, text
    finally:
        served.shutdown()
        served.server_close()


def test_verify_of_a_trickled_shard_ends_in_time(stall: StallRelay, local: Path) -> None:
    """A streamed checksum (``verify`` of a URL) reads by bounded ranged GETs too."""
    url, options = _where(stall, "s3", "fsspec")
    shard = sorted(p.name for p in local.glob("shard-*"))[0]
    stall.mode, stall.match = "trickle", f"GET /{BUCKET}/images.npy/{shard}"
    report = _ends(lambda: packer.verify(url, progress=False, storage_options=options))
    assert not report.ok and "read_timeout=" in report.summary(), report.summary()
