"""Fault injection with real processes: kill -9 a conversion, then resume it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_convert import tree_files

import packer
from packer.errors import FormatError, PackerError
from packer.manifest import MANIFEST_NAME
from packer.tools.image_demo import DemoTree


def run_convert(src: Path, dst: Path, *extra: str, fault: str | None = None) -> int:
    env = dict(os.environ)
    env.pop("PACKER_FAULT", None)
    if fault:
        env["PACKER_FAULT"] = fault
    cmd = [sys.executable, "-m", "packer", "convert", str(src), str(dst), "-q"]
    cmd += ["--shard-size", "15kB", "--workers", "2", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True).returncode


@pytest.mark.parametrize(
    "suffix, fault",
    [
        (".lmdb", "after-shard-0"),
        (".lmdb", "mid-shard-2"),
        (".h5", "mid-shard-1"),
        (".npy", "after-shard-1"),
        (".npy", "before-manifest"),
        (".bmp", "mid-shard-1"),
        (".h5", "after-manifest"),
    ],
)
def test_kill_then_resume_is_identical(
    tree: DemoTree, tmp_path: Path, suffix: str, fault: str
) -> None:
    reference = tmp_path / f"ref{suffix}"
    packer.convert(tree.root, reference, shard_size="15kB", workers=1, progress=False)
    dst = tmp_path / f"out{suffix}"
    assert run_convert(tree.root, dst, fault=fault) == -9  # really killed
    assert not dst.exists()
    with pytest.raises(PackerError, match="does not exist"):
        packer.open_dataset(dst)
    if fault != "after-manifest":
        with pytest.raises(FormatError, match="not a complete packer dataset"):
            packer.LMDBDataset(tmp_path / f"out{suffix}.partial")
    assert run_convert(tree.root, dst, "--resume") == 0
    assert tree_files(dst) == tree_files(reference)
    assert not (tmp_path / f"out{suffix}.partial").exists()


def test_resume_refuses_changed_options_or_source(tree: DemoTree, tmp_path: Path) -> None:
    dst = tmp_path / "out.npy"
    assert run_convert(tree.root, dst, fault="after-shard-0") == -9
    with pytest.raises(PackerError, match="option shard_size 15000 → 30000"):
        packer.convert(tree.root, dst, shard_size="30kB", resume=True, progress=False)
    extra = tree.root / "class_00" / "extra.JPEG"
    extra.write_bytes(tree.good[0].read_bytes())
    try:
        with pytest.raises(PackerError, match="files 13 → 14"):
            packer.convert(tree.root, dst, shard_size="15kB", resume=True, progress=False)
    finally:
        extra.unlink()
    packer.convert(tree.root, dst, shard_size="15kB", resume=True, progress=False)
    assert (dst / MANIFEST_NAME).is_file()
