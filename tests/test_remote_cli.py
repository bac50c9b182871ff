"""``packer inspect URL`` and ``packer verify URL`` (issue 21, second step) through the real CLI
against a real S3 API server on the loopback (moto), with ``--storage-option KEY=VALUE``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from s3_server import S3Server

import packer
from packer.cli.app import main
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.read.describe import inspect_dict
from packer.read.verify import verify
from packer.write.convert import convert_video

NAMES = ("images.npy", "images.h5", "videos.h5")
BUCKET = "cli"  # the module's bucket on the shared S3 server (conftest)


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("remote_cli")
    images = make_image_tree(root / "images", classes=2, per_class=3, size=(64, 48), bad=0)
    frames = make_video_tree(root / "frames", classes=2, per_class=1)
    out = {name: root / name for name in NAMES}
    for name in NAMES[:2]:
        packer.convert(images.root, out[name], shard_size="20kB", workers=1, progress=False)
    convert_video(frames.root, out["videos.h5"], workers=1, progress=False)
    return out


def run(server: S3Server, *args: str) -> Result:
    options = ["--storage-option", f"endpoint_url={server.endpoint}"]
    return CliRunner().invoke(main, [*args, *options])


@pytest.mark.parametrize("name", NAMES)
def test_inspect_and_verify_a_url(server: S3Server, local: dict[str, Path], name: str) -> None:
    url = server.upload(local[name], name)
    shown = run(server, "inspect", url)
    assert shown.exit_code == 0, shown.output
    m = load_manifest(local[name])
    assert f"{url}: packer {m.format} dataset" in shown.output
    assert f"samples: {m.num_samples}" in shown.output
    facts = run(server, "inspect", url, "--json")
    assert facts.exit_code == 0, facts.output
    expected = {k: v for k, v in inspect_dict(local[name]).items() if k != "path"}
    assert {k: v for k, v in json.loads(facts.output).items() if k != "path"} == expected
    checked = run(server, "verify", url, "--json", "--full")
    assert checked.exit_code == 0, checked.output
    report, mine = json.loads(checked.output), verify(local[name], full=True, progress=False)
    assert report["ok"] and report["path"] == url
    for key in ("files_checked", "samples_checked", "decoded"):
        assert report[key] == mine.to_dict()[key] > 0


def test_verify_names_a_damaged_remote_record(server: S3Server, local: dict[str, Path]) -> None:
    url = server.upload(local["images.npy"], "damaged.npy")
    manifest = load_manifest(local["images.npy"])
    shard = manifest.shards[0].name
    data = bytearray((local["images.npy"] / shard).read_bytes())
    data[-10] ^= 0x40  # inside the shard's last record
    server.filesystem().pipe_file(f"{url}/{shard}", bytes(data))
    checked = run(server, "verify", url)
    assert checked.exit_code == 1
    assert f"{shard}: checksum differs from the manifest" in checked.output
    assert f"{shard} sample" in checked.output and "differ from their checksum" in checked.output


def test_storage_option_values_and_refusals(server: S3Server, local: dict[str, Path]) -> None:
    url = server.upload(local["images.h5"], "options.h5")
    timeout = ["--storage-option", 'config_kwargs={"connect_timeout": 5}']  # JSON: a dict
    assert run(server, "inspect", url, *timeout).exit_code == 0
    bad = CliRunner().invoke(main, ["verify", url, "--storage-option", "endpoint_url"])
    assert bad.exit_code == 2 and "is not KEY=VALUE" in bad.output
    here = run(server, "verify", str(local["images.h5"]))
    assert here.exit_code == 1 and "--storage-option is for a URL" in here.output
    gone = run(server, "verify", url.replace("options", "nothing"))
    assert gone.exit_code == 1 and "nothing.h5/packer.json" in gone.output
    assert "is not there" in gone.output and "credentials" not in gone.output


def test_inspect_and_verify_a_url_holding_splits(server: S3Server, tmp_path: Path) -> None:
    tree = make_image_tree(tmp_path / "src", classes=2, per_class=3, size=(64, 48), bad=0)
    shutil.copytree(tree.root, tmp_path / "imagenet" / "train")
    shutil.copytree(tree.root, tmp_path / "imagenet" / "val")
    shutil.rmtree(tmp_path / "imagenet" / "val" / "class_01")  # the splits differ
    out = tmp_path / "split.npy"
    packer.convert(tmp_path / "imagenet", out, workers=1, progress=False)
    url = server.upload(out, "split.npy")
    text = run(server, "inspect", url)
    assert text.exit_code == 0, text.output
    assert "with 2 splits" in text.output and f"train: 6 samples ({url}/train)" in text.output
    facts = run(server, "inspect", url, "--json")
    assert facts.exit_code == 0, facts.output
    splits = json.loads(facts.output)["splits"]
    assert {k: v["per_class"] for k, v in splits.items()} == {"train": [3, 3], "val": [3, 0]}
    here = inspect_dict(out)["splits"]
    for name, facts_of in splits.items():
        assert facts_of.pop("path") == f"{url}/{name}"
        assert facts_of == {k: v for k, v in here[name].items() if k != "path"}
    checked = run(server, "verify", url, "--json")
    assert checked.exit_code == 0, checked.output
    mine = verify(out, progress=False).to_dict()
    assert json.loads(checked.output)["files_checked"] == mine["files_checked"] > 0
    assert json.loads(checked.output)["samples_checked"] == 9
    shard = load_manifest(out / "val").shards[0].name
    data = bytearray((out / "val" / shard).read_bytes())
    data[-10] ^= 0x40  # inside the val shard's last record
    server.filesystem().pipe_file(f"{url}/val/{shard}", bytes(data))
    damaged = run(server, "verify", url)
    assert damaged.exit_code == 1
    assert f"val/{shard}: checksum differs from the manifest" in damaged.output
