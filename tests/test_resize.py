"""Write-time resize for images (--short-side/--max-side/--quality/--reencode), every format."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import packer
from packer.cli.app import main
from packer.decode.resize import Resize, resize_to
from packer.demo.image import DemoTree, photo_like
from packer.errors import PackerError

SUFFIXES = [".bmp", ".h5", ".lmdb", ".npy"]


def test_resize_rules() -> None:
    assert resize_to(500, 375, None, 256) == (341, 256)  # short side, aspect kept
    assert resize_to(375, 500, None, 256) == (256, 341)
    assert resize_to(200, 150, None, 256) == (200, 150)  # never enlarged
    assert resize_to(1000, 500, 400, None) == (400, 200)  # max side
    assert resize_to(300, 100, 400, None) == (300, 100)
    with pytest.raises(PackerError, match="exclusive"):
        Resize(max_side=10, short_side=10)
    with pytest.raises(PackerError, match="invalid quality"):
        Resize(quality=0)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_format_stores_shrunk_images(tree: DemoTree, tmp_path: Path, suffix: str) -> None:
    dst = tmp_path / f"small{suffix}"
    result = packer.convert(tree.root, dst, short_side=32, progress=False)
    assert result.manifest.options["resize"] == {
        "quality": 90,
        "max_side": None,
        "short_side": 32,
        "reencode": False,
    }
    ds = packer.open_dataset(dst, output="numpy")
    assert len(ds) == len(tree.good)
    assert {ds[i][0].shape for i in range(len(ds))} == {(32, 43, 3)}  # 64×48 -> 43×32
    plain = packer.convert(tree.root, tmp_path / "plain.lmdb", progress=False).dst
    original = packer.open_dataset(plain, output="pil")[0][0]
    expected = np.asarray(original.resize((43, 32), Image.Resampling.LANCZOS), dtype=float)
    assert abs(ds[0][0] - expected).mean() < 10  # JPEG q90 error on grainy 43×32 pixels (~6.6)


def test_images_within_the_limit_keep_their_bytes(tree: DemoTree, tmp_path: Path) -> None:
    kept = packer.convert(tree.root, tmp_path / "k.lmdb", short_side=100, progress=False)
    ds = packer.open_dataset(kept.dst, output="bytes")
    plain = packer.convert(tree.root, tmp_path / "plain.lmdb", progress=False).dst
    folder = packer.open_dataset(plain, output="bytes")
    assert [ds[i][0] for i in range(len(ds))] == [folder[i][0] for i in range(len(folder))]
    again = packer.convert(
        tree.root, tmp_path / "r.lmdb", short_side=100, reencode=True, quality=50, progress=False
    )
    re = packer.open_dataset(again.dst, output="bytes")
    assert all(re[i][0] != folder[i][0] for i in range(len(re)))
    assert all(Image.open(io.BytesIO(re[i][0])).size == (64, 48) for i in range(len(re)))
    assert sum(len(re[i][0]) for i in range(len(re))) < sum(len(ds[i][0]) for i in range(len(ds)))


def test_odd_images_come_out_rgb_jpeg(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    photo = photo_like(rng, 120, 80)
    photo.convert("CMYK").save(src / "cmyk.jpg", quality=90)
    photo.convert("L").save(src / "gray.jpg", quality=90)
    photo.save(src / "progressive.jpg", quality=90, progressive=True)
    photo.convert("RGBA").save(src / "alpha.png")
    packer.convert(tmp_path / "src", tmp_path / "o.npy", max_side=60, progress=False)
    ds = packer.open_dataset(tmp_path / "o.npy", output="bytes")
    for i in range(len(ds)):
        image = Image.open(io.BytesIO(ds[i][0]))
        assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (60, 40)), ds.keys[i]


def test_cli_inspect_json_and_resume_refuses_changed_options(
    tree: DemoTree, tmp_path: Path
) -> None:
    src = Path(shutil.copytree(tree.root, tmp_path / "src", ignore=shutil.ignore_patterns("b*")))
    dst = tmp_path / "out.lmdb"

    def stop(name: str, number: int) -> None:
        if name == "shard" and number == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        packer.convert(src, dst, short_side=32, shard_size="5kB", progress=False, on_event=stop)
    run = CliRunner().invoke
    refused = run(main, ["convert", str(src), str(dst), "--short-side", "40", "--resume", "-q"])
    assert refused.exit_code != 0 and "cannot resume" in refused.output
    done = run(
        main,
        ["convert", str(src), str(dst), "--short-side", "32", "--shard-size", "5kB", "--resume"]
        + ["--json"],
    )
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output)
    assert summary["samples"] == len(tree.good) and summary["skipped"] == []
    facts = json.loads(run(main, ["inspect", str(dst), "--json"]).output)
    assert facts["options"]["resize"]["short_side"] == 32
    assert sum(facts["per_class"]) == len(tree.good)
    assert "resize: short side 32, quality 90" in run(main, ["inspect", str(dst)]).output
    checked = json.loads(run(main, ["verify", str(dst), "--json"]).output)
    assert checked["ok"] and checked["samples_checked"] == len(tree.good)


def test_video_only_options_are_refused_for_images(tree: DemoTree, tmp_path: Path) -> None:
    with pytest.raises(PackerError, match="fps only apply to video"):
        packer.convert(tree.root, tmp_path / "x.lmdb", fps=5, progress=False)
