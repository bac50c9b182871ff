"""Issue 40, item 5: a store that stops reading a PUT's body mid-way held an upload for the whole
per-attempt deadline (``connect + read + bytes / min_rate``: ~9 h for a 1 GiB shard). packer's
watchdog (:mod:`packer.remote.watchdog`) cuts a connection that moved no byte for
``read_timeout`` seconds while a write waits, so each attempt ends at the stall, whatever the
size. Real sockets: moto behind a relay that stops reading a matching request's body.

No clock is read: the size-scaled deadline is made huge (``min_rate=1``: days for the shard),
so only the watchdog can end an attempt; the test counts the stalled requests and the cuts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from bounds_servers import StopReading, stop_reading
from click.testing import CliRunner
from PIL import Image
from s3_server import S3Server

import packer
from packer.cli.app import main
from packer.errors import DestinationError
from packer.remote import storage, watchdog
from packer.upload.staging import convert_to_url

BUCKET = "bounds-put"
ATTEMPTS = 2
# read_timeout small: the watchdog's window; min_rate=1: the size-scaled deadline is ~100 days
SLOW_DEADLINE = {"connect_timeout": 5, "read_timeout": 1, "min_rate": 1}


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=ATTEMPTS, base=0.01, cap=0.02))


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two noise PNGs of ~4 MB each: one shard larger than the socket buffers on the way."""
    root = tmp_path_factory.mktemp("bounds_put_src") / "images"
    rng = np.random.default_rng(0)
    for k, name in enumerate(("a", "b")):
        (root / name).mkdir(parents=True)
        pixels = rng.integers(0, 256, (1200, 1200, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / name / f"{k}.png", compress_level=1)
    return root


@pytest.fixture
def relay(server: S3Server) -> Iterator[StopReading]:
    with stop_reading(server.endpoint) as running:
        yield running


def _upload(source: Path, relay: StopReading, tmp_path: Path, name: str) -> object:
    args = ["convert", str(source), f"s3://{BUCKET}/{name}", "--workers", "1", "-q"]
    args += ["--staging", str(tmp_path / "staging"), "--format", "npy"]
    for key, value in {"endpoint_url": relay.endpoint, **SLOW_DEADLINE}.items():
        args += ["--storage-option", f"{key}={value}"]
    return CliRunner().invoke(main, args)


def test_the_library_names_the_watchdog_in_the_failure(
    source: Path, relay: StopReading, tmp_path: Path
) -> None:
    relay.match, relay.stalls = f"PUT /{BUCKET}/named.npy/shard-", -1
    options = {"endpoint_url": relay.endpoint, **SLOW_DEADLINE}
    with pytest.raises(DestinationError) as caught:
        convert_to_url(
            source,
            f"s3://{BUCKET}/named.npy",
            storage_options=options,
            format="npy",
            staging=tmp_path / "staging",
            workers=1,
            progress=False,
        )
    assert f"{ATTEMPTS} attempts" in str(caught.value), caught.value
    why = storage.failure(caught.value.__cause__)  # the last attempt's error, as packer says it
    assert "stopped reading the request" in why and "read_timeout=1s" in why, why
    # and the error the user reads says so too, not only a client's "could not connect"
    assert "stopped reading the request" in str(caught.value), caught.value


def test_a_store_that_stops_reading_a_put_is_cut_at_each_attempt(
    source: Path, relay: StopReading, tmp_path: Path
) -> None:
    relay.match, relay.stalls = f"PUT /{BUCKET}/stalled.npy/shard-", -1
    before = len(watchdog.cuts())
    done = _upload(source, relay, tmp_path, "stalled.npy")
    assert done.exit_code != 0 and isinstance(done.exception, SystemExit), done.output
    cut = watchdog.cuts()[before:]
    # every PUT sent was cut (aiohttp tries a request once more on a fresh connection when a
    # pooled one fails: up to two PUTs an attempt), each at its stall
    assert ATTEMPTS <= relay.stalled <= 2 * ATTEMPTS, (relay.stalled, relay.requests)
    assert len(cut) == relay.stalled and all("stopped reading" in why for why in cut), cut
    text = " ".join(done.output.split())
    assert "cannot upload to" in text and f"{ATTEMPTS} attempts" in text, text
    assert "stopped reading the request" in text, text  # the real cause, named


def test_one_stalled_put_is_tried_again_and_the_upload_completes(
    source: Path, relay: StopReading, server: S3Server, tmp_path: Path
) -> None:
    relay.match, relay.stalls = f"PUT /{BUCKET}/once.npy/shard-", 1
    before = len(watchdog.cuts())
    done = _upload(source, relay, tmp_path, "once.npy")
    assert done.exit_code == 0, done.output
    assert relay.stalled >= 1 and len(watchdog.cuts()) - before == relay.stalled
    local = tmp_path / "local.npy"
    packer.convert(source, local, workers=1, progress=False)
    remote = packer.open_dataset(
        f"s3://{BUCKET}/once.npy", output="bytes", storage_options=server.options
    )
    mine = packer.open_dataset(local, output="bytes")
    assert [remote[i] for i in range(len(mine))] == [mine[i] for i in range(len(mine))]
