"""Issue 40, item 5: ``verify --cache-dir`` against a store trickling a byte at a time had no
answer for half an hour: a shard download was bounded only by ``bytes / min_rate`` per attempt.
Cache downloads go through the watched client, whichever backend reads records (:mod:`packer.remote.watchdog`): a connection
that stays busy for ``read_timeout`` s below ``min_rate`` is cut, so the attempt fails at the
window, and verify reports the shard. Real sockets: moto behind a trickling relay.

No clock is read: the watchdog's cuts are counted and the finding names them (the per-attempt
deadline would end with a plain timeout, no cut)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server
from stall_relay import StallRelay, stall_relay

import packer
from packer.demo.image import make_image_tree
from packer.remote import storage, watchdog

BUCKET = "bounds-get"
ATTEMPTS = 2
# a trickle of 20 bytes/s is far below min_rate; the 1 s window ends each attempt
BOUNDS = {"connect_timeout": 5, "read_timeout": 1, "min_rate": 1000}


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=ATTEMPTS, base=0.01, cap=0.02))


@pytest.fixture(scope="module")
def relay(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StallRelay]:
    root = tmp_path_factory.mktemp("bounds_get")
    source = make_image_tree(root / "images", classes=2, per_class=3, size=(64, 48), bad=0).root
    packer.convert(source, root / "images.npy", shard_size="8kB", workers=1, progress=False)
    server.upload(root / "images.npy", "images.npy")
    with stall_relay(server.endpoint, life=600) as running:
        yield running


@pytest.mark.parametrize("backend", ["fsspec", "obstore"])
def test_a_trickled_shard_download_is_cut_at_the_window(
    relay: StallRelay, tmp_path: Path, backend: str
) -> None:
    """Whichever backend serves the ranged record reads (obstore: not watched, bounded per
    attempt), a shard download goes through the watched client."""
    url = f"s3://{BUCKET}/images.npy"
    options = {**BOUNDS, "endpoint_url": relay.endpoint, "backend": backend}
    relay.mode, relay.match, relay.every = "trickle", f"GET /{BUCKET}/images.npy/shard-00000", 0.05
    before = len(watchdog.cuts())
    try:
        report = packer.verify(url, progress=False, storage_options=options, cache_dir=tmp_path)
    finally:
        relay.mode, relay.match = "pass", ""
    cut = watchdog.cuts()[before:]
    assert len(cut) >= ATTEMPTS and all("below min_rate=1000" in why for why in cut), cut
    summary = report.summary()
    assert not report.ok and "shard-00000" in summary and "below min_rate" in summary, summary
    assert "shard-00001" not in summary, summary  # the others downloaded and checked
