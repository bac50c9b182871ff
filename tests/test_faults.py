"""Fault injection with real processes: kill -9 a conversion (image or video), then resume it.

The conversion runs in a child process whose ``on_event`` callback (the public progress hook)
SIGKILLs it at a chosen point; ``packer convert --resume`` must then produce the same bytes as an
uninterrupted run.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import packer
from packer.core.manifest import MANIFEST_NAME
from packer.core.sizes import parse_size
from packer.demo.image import DemoTree
from packer.demo.video import make_video_tree
from packer.errors import FormatError, PackerError
from packer.source.images import scan
from packer.write.pipeline import plan_shards

KILLER = """
import os, signal, sys
import packer
src, dst, event, number, shard_size, kind = sys.argv[1:7]

def on_event(name, n):
    if name == event and n == int(number):
        os.kill(os.getpid(), signal.SIGKILL)

packer.convert(src, dst, shard_size=shard_size, workers=2, progress=False, kind=kind,
               on_event=on_event)
"""


def kill_at(src: Path, dst: Path, event: str, number: int, shard_size: str, kind: str) -> int:
    cmd = [sys.executable, "-c", KILLER, str(src), str(dst), event, str(number), shard_size, kind]
    return subprocess.run(cmd, capture_output=True, text=True).returncode


def resume_cli(src: Path, dst: Path, shard_size: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "packer", "convert", str(src), str(dst), "-q", "--resume"]
    cmd += ["--shard-size", shard_size, "--workers", "2"]
    return subprocess.run(cmd, capture_output=True, text=True)


def mid_shard(sizes: list[int], shard_size: str, shard: int) -> int:
    """The first sample of planned ``shard``, which must hold two or more samples."""
    shard_of, _ = plan_shards(sizes, parse_size(shard_size))
    members = [i for i, s in enumerate(shard_of.tolist()) if s == shard]
    assert len(members) >= 2, "the fault must fall inside a shard"
    return members[0]


@pytest.mark.parametrize(
    "suffix, fault",
    [
        (".lmdb", ("shard", 0)),
        (".lmdb", ("mid", 2)),
        (".h5", ("mid", 1)),
        (".npy", ("shard", 1)),
        (".npy", ("tables", 0)),
        (".bmp", ("mid", 1)),
        (".h5", ("manifest", 0)),
    ],
)
def test_kill_then_resume_is_identical(
    tree_files: Any, tree: DemoTree, tmp_path: Path, suffix: str, fault: tuple[str, int]
) -> None:
    reference = tmp_path / f"ref{suffix}"
    packer.convert(tree.root, reference, shard_size="15kB", workers=1, progress=False)
    event, number = fault
    if event == "mid":
        sizes = [s.size for s in scan(tree.root).samples]
        event, number = "sample", mid_shard(sizes, "15kB", number)
    dst = tmp_path / f"out{suffix}"
    assert kill_at(tree.root, dst, event, number, "15kB", "image") == -9  # really killed
    assert not dst.exists()
    with pytest.raises(PackerError, match="does not exist"):
        packer.open_dataset(dst)
    if event != "manifest":
        with pytest.raises(FormatError, match="not a complete packer dataset"):
            packer.LMDBDataset(tmp_path / f"out{suffix}.partial")
    assert resume_cli(tree.root, dst, "15kB").returncode == 0
    assert tree_files(dst) == tree_files(reference)
    assert not (tmp_path / f"out{suffix}.partial").exists()


@pytest.mark.parametrize("suffix", [".npy", ".h5", ".lmdb", ".bmp"])
def test_video_kill_then_resume_is_identical(tree_files: Any, tmp_path: Path, suffix: str) -> None:
    tree = make_video_tree(tmp_path / "frames", classes=2, per_class=3, frames=(4, 9))
    reference = tmp_path / f"ref{suffix}"
    packer.convert(tree.root, reference, shard_size="60kB", workers=1, progress=False)
    assert len(packer.open_dataset(reference)) == 6
    dst = tmp_path / f"out{suffix}"
    assert kill_at(tree.root, dst, "shard", 0, "60kB", "video") == -9
    partial = tmp_path / f"out{suffix}.partial"
    assert (partial / "_progress" / "shard-00000.json").is_file()
    result = resume_cli(tree.root, dst, "60kB")
    assert result.returncode == 0, result.stderr
    assert tree_files(dst) == tree_files(reference)
    clips = packer.open_dataset(dst, num_frames=4, output="bytes")
    again = packer.open_dataset(reference, num_frames=4, output="bytes")
    assert [clips[i] for i in range(len(clips))] == [again[i] for i in range(len(again))]


def test_resume_refuses_changed_options_or_source(tree: DemoTree, tmp_path: Path) -> None:
    src = Path(shutil.copytree(tree.root, tmp_path / "src"))  # changed below: a private copy
    dst = tmp_path / "out.npy"
    assert kill_at(src, dst, "shard", 0, "15kB", "image") == -9
    with pytest.raises(PackerError, match="option shard_size 15000 → 30000"):
        packer.convert(src, dst, shard_size="30kB", resume=True, progress=False)
    extra = src / "class_00" / "extra.JPEG"
    extra.write_bytes(tree.good[0].read_bytes())
    with pytest.raises(PackerError, match="files 13 → 14"):
        packer.convert(src, dst, shard_size="15kB", resume=True, progress=False)
    extra.unlink()
    packer.convert(src, dst, shard_size="15kB", resume=True, progress=False)
    assert (dst / MANIFEST_NAME).is_file()


def test_resume_refuses_a_file_rewritten_in_place_with_its_size(
    tree_files: Any, tree: DemoTree, tmp_path: Path
) -> None:
    src = Path(shutil.copytree(tree.root, tmp_path / "src"))
    dst = tmp_path / "out.lmdb"
    assert kill_at(src, dst, "shard", 0, "15kB", "image") == -9
    first = next(s for s in scan(src).samples if "broken" not in s.path)  # in shard 0, written
    data = bytearray(Path(first.path).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(first.path).write_bytes(bytes(data))  # same size, new content and mtime
    assert Path(first.path).stat().st_size == first.size
    result = resume_cli(src, dst, "15kB")
    assert result.returncode == 1
    assert f"input {first.path!r} was modified after the interrupted conversion" in result.stderr
    assert not dst.exists()
    again = subprocess.run(  # start over, as the message says: the same as a fresh conversion
        [sys.executable, "-m", "packer", "convert", str(src), str(dst), "-q", "--overwrite"]
        + ["--shard-size", "15kB"],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr
    fresh = tmp_path / "fresh.lmdb"
    packer.convert(src, fresh, shard_size="15kB", workers=1, progress=False)
    assert tree_files(dst) == tree_files(fresh)


def test_a_finished_but_unpublished_conversion_is_published_not_discarded(
    tree_files: Any, tree: DemoTree, tmp_path: Path
) -> None:
    """Killed after its manifest: a plain rerun with the same options publishes it as it is
    (the shard files keep their inode: nothing rewritten); other options are refused."""
    reference = tmp_path / "ref.lmdb"
    packer.convert(tree.root, reference, shard_size="15kB", workers=1, progress=False)
    dst = tmp_path / "out.lmdb"
    assert kill_at(tree.root, dst, "manifest", 0, "15kB", "image") == -9
    partial = tmp_path / "out.lmdb.partial"
    inode = (partial / "shard-00000.mdb").stat().st_ino
    other = subprocess.run(
        [sys.executable, "-m", "packer", "convert", str(tree.root), str(dst), "-q"]
        + ["--shard-size", "30kB", "--resume"],
        capture_output=True,
        text=True,
    )
    assert other.returncode == 1
    assert "holds a finished conversion" in other.stderr
    assert "option shard_size 15000 → 30000" in other.stderr
    plain = subprocess.run(
        [sys.executable, "-m", "packer", "convert", str(tree.root), str(dst)]
        + ["--shard-size", "15kB"],
        capture_output=True,
        text=True,
    )
    assert plain.returncode == 0, plain.stderr
    assert "interrupted before publication was published" in plain.stdout
    assert (dst / "shard-00000.mdb").stat().st_ino == inode
    assert tree_files(dst) == tree_files(reference)
    again = resume_cli(tree.root, dst, "15kB")  # and once published, --resume says complete
    assert again.returncode == 0, again.stderr
    assert not (tmp_path / "out.lmdb.partial.lock").exists()
    done = packer.convert(tree.root, dst, shard_size="15kB", resume=True, progress=False)
    assert "already complete" in done.summary()
    assert (dst / "shard-00000.mdb").stat().st_ino == inode
