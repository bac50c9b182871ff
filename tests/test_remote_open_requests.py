"""What a remote open asks the store (issue 21): ``packer.json`` fetched once (the class choice
hands it to the open of the same call, and to no other), each whole object by one GET without a
HEAD first (the listing gave the tables' sizes). Counted in the real fault proxy's log in front
of a real S3 API server (moto)."""

from __future__ import annotations

import pytest
from fault_proxy import FaultProxy
from s3_server import S3Server

import packer
from packer.demo.image import make_image_tree
from packer.errors import FormatError
from packer.read.store import open_packed
from packer.remote.opener import fetched_manifest

BUCKET = "opens"


@pytest.fixture(scope="module")
def url(server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("opens")
    tree = make_image_tree(root / "images", classes=2, per_class=3, size=(32, 24), bad=0)
    packer.convert(tree.root, root / "out.npy", shard_size="6kB", workers=1, progress=False)
    return server.upload(root / "out.npy", "out.npy")


def _requests(proxy: FaultProxy) -> list[str]:
    """The requests of the log, without the outcome and the listing's query."""
    return [line.split(" -> ")[0].split("?")[0] for line in proxy.served]


def test_an_open_asks_each_object_once(url: str, proxy: FaultProxy) -> None:
    proxy.served.clear()
    dataset = packer.open_dataset(
        url, output="bytes", storage_options={"endpoint_url": proxy.endpoint}
    )
    assert len(dataset) == 6
    assert sorted(_requests(proxy)) == sorted(
        [f"GET /{BUCKET}/out.npy/packer.json", f"GET /{BUCKET}"]  # the manifest, one listing
        + [f"GET /{BUCKET}/out.npy/{name}" for name in ("index.npy", "records.npy", "keys.txt")]
    )  # was 11: packer.json twice, and a HEAD before each of the 4 whole-object GETs


def test_a_handed_manifest_reaches_no_other_open(url: str, proxy: FaultProxy) -> None:
    options = {"endpoint_url": proxy.endpoint}
    with pytest.raises(FormatError, match="holds images, not videos"):
        packer.open_dataset(url, kind="video", storage_options=options)  # chose, then refused
    proxy.served.clear()
    assert len(open_packed(url, storage_options=options).first) == 6
    assert _requests(proxy).count(f"GET /{BUCKET}/out.npy/packer.json") == 1  # its own
    with fetched_manifest(url, None, options) as (_, manifest):
        proxy.served.clear()
        other = {"endpoint_url": proxy.endpoint, "anon": False}  # another client: fetched
        assert open_packed(url, storage_options=other).manifest == manifest
        assert _requests(proxy).count(f"GET /{BUCKET}/out.npy/packer.json") == 1
