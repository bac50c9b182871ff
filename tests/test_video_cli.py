"""Video through the public entry points: packer.convert, open_dataset, verify and the CLI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.demo.video import VideoTree, make_video_tree


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> VideoTree:
    return make_video_tree(tmp_path_factory.mktemp("v") / "frames", bad=1, empty=1)


def run(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def test_cli_convert_inspect_verify_video(frames: VideoTree, tmp_path: Path, suffix: str) -> None:
    dst = tmp_path / f"clips{suffix}"
    code, out = run("convert", frames.root, dst, "--workers", "2", "-q")
    assert code == 0, out
    assert f"{len(frames.videos)} videos" in out and "skipped 2 input(s)" in out
    code, out = run("inspect", dst)
    assert code == 0, out
    assert f"videos: {len(frames.videos)}" in out and "padding overhead" in out
    assert "frames: stored as found in the frame folders (not re-encoded)" in out
    assert "quality" not in out and " samples, " not in out  # shards count frames, not samples
    code, out = run("verify", dst, "--full", "-q")
    assert code == 0 and ": OK" in out, out


def test_open_dataset_dispatches_on_video(frames: VideoTree, tmp_path: Path) -> None:
    dst = tmp_path / "clips.npy"
    packer.convert(frames.root, dst, progress=False)
    clips = packer.open_dataset(dst, num_frames=4, output="numpy")
    assert isinstance(clips, packer.NPYVideoDataset)
    clip, label = clips[0]
    assert clip.shape == (4, 48, 64, 3) and clip.dtype == np.uint8 and label == 0
    folder = packer.open_dataset(frames.root, num_frames=4, output="numpy")
    assert isinstance(folder, packer.FolderVideoDataset)
    assert np.array_equal(folder[0][0], clip)


def test_verify_names_the_corrupt_frame(frames: VideoTree, tmp_path: Path) -> None:
    dst = tmp_path / "clips.h5"
    packer.convert(frames.root, dst, kind="video", progress=False)
    victim = next(dst.rglob("*.h5"))
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    victim.write_bytes(bytes(raw))
    report = packer.verify(dst, progress=False)
    assert not report.ok and "frame" in report.summary()


def test_video_options_refused_for_images(tmp_path: Path) -> None:
    from packer.demo.image import make_image_tree

    tree = make_image_tree(tmp_path / "img", classes=1, per_class=2, size=(64, 48), bad=0)
    with pytest.raises(packer.PackerError, match="fps only apply to video sources"):
        packer.convert(tree.root, tmp_path / "o.npy", fps=5, progress=False)


def test_demo_video(tmp_path: Path) -> None:
    code, out = run(
        "demo", tmp_path / "vd", "--kind", "video", "--classes", "2", "--per-class", "2", "-q"
    )
    assert code == 0, out
    assert "clips/s" in out and "| npy |" in out
