"""Issue 40, items 9 and 10: over HTTP a 5xx on the HEAD that sizes a shard became fsspec's
FileNotFoundError, reported as "missing or access is denied, check the credentials" and never
tried again; an open during an ``--overwrite`` upload (no ``packer.json`` there for a moment)
blamed the credentials too. A server error is tried again and, if it lasts, named as one (its
status); a manifest that is not there says what that means. Real HTTP server on the loopback."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from bounds_servers import FileServer, file_server

import packer
from packer.demo.image import make_image_tree
from packer.errors import FormatError, PackerError
from packer.remote import storage

ATTEMPTS = 3
OPTIONS = {"backend": "fsspec"}


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=ATTEMPTS, base=0.01, cap=0.02))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileServer]:
    root = tmp_path_factory.mktemp("bounds_http")
    source = make_image_tree(root / "src", classes=2, per_class=3, size=(64, 48), bad=0).root
    (root / "www").mkdir()
    packer.convert(source, root / "www" / "images.npy", shard_size="8kB", workers=1, progress=False)
    with file_server(root / "www") as running:
        yield running


@pytest.fixture
def server(served: FileServer) -> Iterator[FileServer]:
    served.once.clear()
    served.forever.clear()
    served.seen.clear()
    yield served
    served.once.clear()
    served.forever.clear()


SIZING = r"^(HEAD|GET) /images\.npy/shard-00001\.npy$"  # the HEAD and fsspec's GET after it


def test_a_5xx_on_a_sizing_head_is_tried_again(server: FileServer) -> None:
    server.fail(SIZING, ["500", "500", "503", "503"])  # two whole tries (HEAD, then GET) fail
    remote = packer.open_dataset(
        f"{server.endpoint}/images.npy", output="bytes", storage_options=OPTIONS
    )
    local = packer.open_dataset(server.root / "images.npy", output="bytes")
    assert [remote[i] for i in range(len(local))] == [local[i] for i in range(len(local))]
    assert server.once == [], server.seen  # every injected error was served, then it worked
    heads = [s for s in server.seen if s.startswith("HEAD /images.npy/shard-00001.npy")]
    assert len(heads) == 3, server.seen


def test_a_lasting_5xx_is_named_as_a_server_error(server: FileServer) -> None:
    server.always(SIZING, "500")
    with pytest.raises(PackerError) as caught:
        packer.open_dataset(f"{server.endpoint}/images.npy", storage_options=OPTIONS)
    text = str(caught.value)
    assert not isinstance(caught.value, FormatError), text
    assert f"{ATTEMPTS} attempts" in text and "HTTP 500" in text and "server error" in text, text
    assert "credentials" not in text and "missing" not in text, text


def test_a_404_is_still_missing_at_once(server: FileServer) -> None:
    server.always(SIZING, "404")
    with pytest.raises(FormatError, match="missing or access is denied"):
        packer.open_dataset(f"{server.endpoint}/images.npy", storage_options=OPTIONS)
    assert sum("HEAD /images.npy/shard-00001.npy" in s for s in server.seen) == 1


def test_an_open_while_the_manifest_is_replaced_says_so(server: FileServer, tmp_path: Path) -> None:
    """An ``--overwrite`` upload deletes the old manifest first: an open then finds the tables
    and shards but no ``packer.json``."""
    copy = server.root / "replacing.npy"
    shutil.copytree(server.root / "images.npy", copy)
    (copy / "packer.json").unlink()
    try:
        with pytest.raises(FormatError) as caught:
            packer.open_dataset(f"{server.endpoint}/replacing.npy", storage_options=OPTIONS)
    finally:
        shutil.rmtree(copy)
    text = str(caught.value)
    assert "replacing.npy/packer.json' is not there" in text and "--overwrite" in text, text
    assert "credentials" not in text, text
    server.always(r"packer\.json", "403")  # a denial still says to check the credentials
    with pytest.raises(FormatError, match="access is denied.*credentials"):
        packer.open_dataset(f"{server.endpoint}/images.npy", storage_options=OPTIONS)
