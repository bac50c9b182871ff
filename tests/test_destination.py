"""The source is sacred and a destination has one writer: refusals come before any work."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import packer
from packer.demo.image import DemoTree
from packer.errors import DestinationError
from packer.read.verify import verify


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def data(tree: DemoTree, tmp_path: Path) -> Path:
    """``data/train`` (a copy of the tree) and a sibling ``data/val``."""
    root = tmp_path / "data"
    shutil.copytree(tree.root, root / "train")
    shutil.copytree(tree.root, root / "val")
    return root


@pytest.mark.parametrize(
    "dst, message",
    [
        ("data", "contains the source"),
        ("data/train", "is the source itself"),
        ("data/train/out.lmdb", "is inside the source"),
        ("data/train/class_00", "is inside the source"),
    ],
)
def test_destination_never_touches_the_source(
    data: Path, tmp_path: Path, dst: str, message: str
) -> None:
    before = snapshot(data)
    for overwrite in (False, True):
        with pytest.raises(DestinationError, match=message):
            packer.convert(
                data / "train", tmp_path / dst, format="bmp", overwrite=overwrite, progress=False
            )
    assert snapshot(data) == before


def test_overwrite_replaces_only_packer_outputs(tree: DemoTree, tmp_path: Path) -> None:
    folder = tmp_path / "photos.lmdb"
    folder.mkdir()
    (folder / "holiday.jpg").write_bytes(b"precious")
    with pytest.raises(DestinationError, match="not a packer output"):
        packer.convert(tree.root, folder, overwrite=True, progress=False)
    assert (folder / "holiday.jpg").read_bytes() == b"precious"
    a_file = tmp_path / "notes.npy"
    a_file.write_bytes(b"mine")
    with pytest.raises(DestinationError, match="not a folder packer wrote"):
        packer.convert(tree.root, a_file, overwrite=True, progress=False)
    assert a_file.read_bytes() == b"mine"
    out = tmp_path / "out.npy"
    packer.convert(tree.root, out, progress=False)
    packer.convert(tree.root, out, overwrite=True, format="hdf5", progress=False)
    assert packer.open_dataset(out).manifest.format == "hdf5"


KILLER = """
import os, signal, sys, packer
def on_event(name, n):
    if name == "shard" and n == 0:
        os.kill(os.getpid(), signal.SIGKILL)
packer.convert(sys.argv[1], sys.argv[2], shard_size="15kB", workers=1, progress=False,
               on_event=on_event)
"""


def test_an_interrupted_conversion_is_never_silently_discarded(
    tree: DemoTree, tmp_path: Path
) -> None:
    dst = tmp_path / "out.lmdb"
    done = subprocess.run([sys.executable, "-c", KILLER, str(tree.root), str(dst)])
    assert done.returncode == -9
    partial = tmp_path / "out.lmdb.partial"
    kept = snapshot(partial)
    with pytest.raises(DestinationError, match="add --resume to continue it, or --overwrite"):
        packer.convert(tree.root, dst, shard_size="15kB", progress=False)
    assert snapshot(partial) == kept
    result = packer.convert(tree.root, dst, shard_size="15kB", resume=True, progress=False)
    assert "nothing to resume" not in result.summary()
    fresh = packer.convert(tree.root, tmp_path / "new.lmdb", resume=True, progress=False)
    assert "nothing to resume" in fresh.summary()


HANG = 300.0  # a hang guard, never reached by a slow run

STOPPER = """
import os, signal, sys, packer
def on_event(name, n):
    if name == "shard" and n == 0:
        os.kill(os.getpid(), signal.SIGSTOP)  # a live conversion, paused mid-way
packer.convert(sys.argv[1], sys.argv[2], shard_size=sys.argv[3], workers=1, progress=False,
               on_event=on_event)
print("done")
"""


def _stopped_writer(tree: DemoTree, dst: Path, shard_size: str) -> subprocess.Popen[str]:
    """A conversion to ``dst`` in a process that stops itself (SIGSTOP) after its first shard:
    writing, its lock held, for as long as the test needs (an event: the process's state),
    never a conversion slowed by sleeps that a loaded machine could let finish first."""
    first = subprocess.Popen(
        [sys.executable, "-c", STOPPER, str(tree.root), str(dst), shard_size],
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + HANG
    while True:
        with open(f"/proc/{first.pid}/stat") as fh:
            if fh.read().split(") ")[1][0] == "T":
                return first
        assert first.poll() is None and time.monotonic() < deadline, "it never stopped"
        time.sleep(0.05)


def test_two_conversions_to_one_destination(
    tree_files: Any, tree: DemoTree, tmp_path: Path
) -> None:
    dst = tmp_path / "out.npy"
    first = _stopped_writer(tree, dst, "5kB")
    lock = tmp_path / "out.npy.partial.lock"
    try:
        assert lock.read_text().strip()  # its lock names it
        second = subprocess.run(
            [sys.executable, "-m", "packer", "convert", str(tree.root), str(dst), "-q"]
            + ["--overwrite"],
            capture_output=True,
            text=True,
        )
    finally:
        first.send_signal(signal.SIGCONT)
    out, _ = first.communicate(timeout=HANG)
    assert first.returncode == 0 and "done" in out
    assert second.returncode == 1
    assert (
        f"being written by another conversion (process {first.pid})"
        in second.stderr + second.stdout
    )
    assert verify(dst, progress=False).ok
    assert len(packer.open_dataset(dst)) == len(tree.good)
    assert not lock.exists()


def test_a_dead_writers_lock_is_taken_over(tree: DemoTree, tmp_path: Path) -> None:
    dst = tmp_path / "out.lmdb"
    assert subprocess.run([sys.executable, "-c", KILLER, str(tree.root), str(dst)]).returncode == -9
    assert (tmp_path / "out.lmdb.partial.lock").exists()  # left by the killed process
    packer.convert(tree.root, dst, shard_size="15kB", resume=True, progress=False)
    assert verify(dst, progress=False).ok


def test_a_live_writer_is_named_and_its_folder_never_offered(
    tree_files: Any, tree: DemoTree, tmp_path: Path
) -> None:
    dst = tmp_path / "out.npy"
    first = _stopped_writer(tree, dst, "15kB")
    try:
        assert (tmp_path / "out.npy.partial" / "_progress" / "shard-00000.json").is_file()
        for extra in ([], ["--overwrite"], ["--resume"], ["--overwrite", "--resume"]):
            second = subprocess.run(
                [sys.executable, "-m", "packer", "convert", str(tree.root), str(dst), "-q"]
                + ["--shard-size", "15kB", *extra],
                capture_output=True,
                text=True,
            )
            said = second.stderr + second.stdout
            assert second.returncode == 1, (extra, said)
            assert f"being written by another conversion (process {first.pid})" in said, extra
            assert "add --resume" not in said and "Remove it yourself" not in said, extra
    finally:
        first.send_signal(signal.SIGCONT)
    out, _ = first.communicate(timeout=HANG)
    assert first.returncode == 0 and "done" in out
    assert verify(dst, progress=False).ok
    reference = tmp_path / "ref.npy"
    packer.convert(tree.root, reference, shard_size="15kB", workers=1, progress=False)
    assert tree_files(dst) == tree_files(reference)
    assert not (tmp_path / "out.npy.partial.lock").exists()


def test_a_destination_reached_through_a_followed_symlink_is_refused(
    tree: DemoTree, tmp_path: Path
) -> None:
    """``src/cls -> outdir``: converting into ``outdir/o.bmp`` would pack its own output."""
    src, outdir = tmp_path / "src", tmp_path / "outdir"
    shutil.copytree(tree.root, src)
    outdir.mkdir()
    dst = outdir / "o.bmp"
    packer.convert(tree.root, dst, progress=False)  # an earlier output, there before the link
    (src / "cls").symlink_to(outdir, target_is_directory=True)
    before = snapshot(outdir)
    for how in ({"overwrite": True}, {"resume": True}):
        with pytest.raises(DestinationError, match="through the symlink .*src/cls' -> .*outdir'"):
            packer.convert(src, dst, progress=False, **how)
    assert snapshot(outdir) == before
    assert not (outdir / "o.bmp.partial").exists()
    fresh = outdir / "new.npy"  # inside the followed folder too: a rerun would pack it
    (outdir / "photo.jpg").write_bytes(tree.good[0].read_bytes())
    with pytest.raises(DestinationError, match="reached by the scan"):
        packer.convert(src, fresh, progress=False)
    assert not fresh.exists()
