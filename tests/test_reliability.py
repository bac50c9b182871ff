"""Hostile inputs, disk full, and long multi-epoch runs: nothing lost, nothing corrupt, no leaks."""

from __future__ import annotations

import contextlib
import gc
import io
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from torch.utils.data import DataLoader

import packer
from packer.core.manifest import MANIFEST_NAME
from packer.core.sizes import parse_size
from packer.demo.image import DemoTree, photo_like
from packer.errors import DestinationError


def jpeg(image: Image.Image, **kw: object) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", **kw)
    return out.getvalue()


@pytest.fixture
def hostile(tmp_path: Path) -> tuple[Path, dict[str, bytes], set[str]]:
    """A tree mixing good images of every kind with every kind of bad input."""
    root = tmp_path / "hostile"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    photo = photo_like(np.random.default_rng(1), 64, 48)
    good = {
        "a/plain": jpeg(photo),
        "a/gray": jpeg(photo.convert("L")),
        "a/cmyk": jpeg(photo.convert("CMYK")),
        "a/with space ünïcödé": jpeg(photo),
        "b/palette": b"",
        "b/sixteen": b"",
        "b/big": jpeg(Image.new("RGB", (70, 70), (9, 99, 199))),  # over the lowered limit
    }
    buf = io.BytesIO()
    photo.convert("P").save(buf, format="PNG")
    good["b/palette"] = buf.getvalue()
    buf = io.BytesIO()
    Image.fromarray(np.full((6, 5), 50000, dtype=np.uint16)).save(buf, format="PNG")
    good["b/sixteen"] = buf.getvalue()
    names = {"a/plain": ".jpg", "a/gray": ".JPG", "a/cmyk": ".jpeg", "a/with space ünïcödé": ".jpg"}
    names |= {"b/palette": ".png", "b/sixteen": ".png", "b/big": ".jpg"}
    for key, data in good.items():
        (root / (key + names[key])).write_bytes(data)
    bad = {
        "a/empty.jpg": b"",
        "a/truncated.jpg": jpeg(photo)[:300],
        "a/notes.jpg": b"this is a text file, not a picture\n",
        "b/bomb.jpg": jpeg(Image.new("RGB", (90, 90))),  # over twice the lowered limit
    }
    for name, data in bad.items():
        (root / name).write_bytes(data)
    os.symlink("loop2.jpg", root / "b/loop1.jpg")
    os.symlink("loop1.jpg", root / "b/loop2.jpg")
    # Reading /proc/self/mem at offset 0 fails with EIO even for root: an unreadable file.
    os.symlink("/proc/self/mem", root / "b/unreadable.jpg")
    bad_names = set(bad) | {"b/loop1.jpg", "b/loop2.jpg", "b/unreadable.jpg"}
    return root, good, bad_names


def test_hostile_tree_converts_with_every_problem_reported(
    hostile: tuple[Path, dict[str, bytes], set[str]],
    tmp_path: Path,
    suffix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, good, bad = hostile
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 3100)  # 70×70 warns, 90×90 is a bomb
    result = packer.convert(root, tmp_path / f"out{suffix}", workers=1, progress=False)
    reported = {str(Path(s.path).relative_to(root)): s.reason for s in result.skipped}
    assert set(reported) == bad
    assert "empty file" in reported["a/empty.jpg"]
    assert "not an image" in reported["a/notes.jpg"]
    assert "decompression bomb" in reported["b/bomb.jpg"]
    assert "cannot read" in reported["b/unreadable.jpg"]
    dataset = packer.open_dataset(result.dst, output="bytes")
    assert sorted(dataset.keys) == sorted(good)
    for i, key in enumerate(dataset.keys):
        if suffix != ".bmp":
            assert dataset[i][0] == good[key]
    rgb = packer.open_dataset(result.dst)
    arrays = packer.open_dataset(result.dst, output="numpy")
    for i in range(len(rgb)):
        assert rgb[i][0].mode == "RGB"
        assert arrays[i][0].ndim == 3 and arrays[i][0].shape[2] == 3


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 40 kB tmpfs (CI runs as root); remountable larger to let a resume finish."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=40k", "tmpfs", str(mount)])
    assert done.returncode == 0, "mounting a tmpfs needs root, as in CI"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)])


def test_disk_full_keeps_a_resumable_partial(
    tree_files: Any,
    tree: DemoTree,
    tmp_path: Path,
    small_disk: Path,
    suffix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _past_the_preflight_check(monkeypatch)
    reference = tmp_path / f"ref{suffix}"
    packer.convert(tree.root, reference, shard_size="10kB", workers=1, progress=False)
    dst = small_disk / f"out{suffix}"
    with pytest.raises(DestinationError, match="disk full.*--resume"):
        packer.convert(tree.root, dst, shard_size="10kB", workers=2, progress=False)
    partial = small_disk / f"out{suffix}.partial"
    assert partial.is_dir() and not (partial / MANIFEST_NAME).exists() and not dst.exists()
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    packer.convert(tree.root, dst, shard_size="10kB", workers=2, resume=True, progress=False)
    assert tree_files(dst) == tree_files(reference)


@pytest.mark.parametrize("part", [None, (0, 1)], ids=["whole", "part"])
def test_a_failed_conversion_stops_its_loading_pool_before_it_raises(
    tree: DemoTree, tmp_path: Path, part: tuple[int, int] | None
) -> None:
    """The pool that loads ahead was shut down only when the garbage collector freed the
    failed run's generator: a later run's new thread ran that shutdown in its start and the
    suite hung (this test's disk-full neighbour, under xdist). Now it is stopped before the
    error leaves convert, while the traceback still holds every frame."""
    import multiprocessing

    gc.disable()
    try:
        with pytest.raises(packer.PackerError) as caught:
            packer.convert(
                tree.root, tmp_path / "o.lmdb", workers=2, strict=True, part=part, progress=False
            )
        assert caught.value.__traceback__ is not None  # the failed frames are still alive
        assert multiprocessing.active_children() == []
    finally:
        gc.enable()
    with pytest.raises(packer.PackerError, match="pair"):  # the CLI's "1/4" in Python
        packer.convert(tree.root, tmp_path / "p.lmdb", part="1/4", progress=False)  # type: ignore[arg-type]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _settled_fds() -> int:
    """Open descriptors once the epoch's workers are gone: every worker process exited and
    reaped, every queue's feeder thread ended, their objects collected (events, however late
    a loaded machine lets them come; a hang guard of 300 s). A leaked descriptor stays."""
    deadline = time.monotonic() + 300
    while multiprocessing.active_children() or any(
        t.name == "QueueFeederThread" for t in threading.enumerate()
    ):
        assert time.monotonic() < deadline, "the workers never ended (a hang guard)"
        time.sleep(0.01)
    gc.collect()
    return _open_fds()


def _rss_kb() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


@pytest.mark.parametrize("fmt", [".lmdb", ".h5"])
def test_twenty_epochs_of_fresh_workers_leak_nothing(packed: dict[str, Path], fmt: str) -> None:
    dataset = packer.open_dataset(packed[fmt], output="bytes")
    loader = DataLoader(
        dataset,
        batch_size=3,
        num_workers=2,  # 2 x 20 fresh workers: a leak per worker shows as one per worker would
        persistent_workers=False,
        multiprocessing_context="fork",
        collate_fn=packer.collate_bytes,
    )
    counts, fds, rss = [], [], []
    for epoch in range(20):
        counts.append(sum(len(labels) for _, _, labels in loader))
        dataset[0]  # the parent reads too, between epochs
        fds.append(_settled_fds() if epoch < 5 or epoch >= 15 else _open_fds())
        rss.append(_rss_kb())
    print(f"{fmt}: open fds per epoch {fds}; RSS kB first/last {rss[0]}/{rss[-1]}")
    assert counts == [len(dataset)] * 20
    # workers shut down asynchronously, so a pipe may linger at one sample; a leak never shrinks
    assert min(fds[-5:]) <= min(fds[:5])
    assert rss[-1] - rss[1] < 20_000


def _du(folder: Path) -> int:
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file())


def _needed(message: str) -> int:
    match = re.search(r"about (\S+ \S+) more is needed \((an estimate[^)]*)\)", message)
    assert match, message
    return parse_size(match.group(1).replace(" ", ""))


def _past_the_preflight_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the conversion start on a disk too small for it, to reach the mid-write guard (the
    pre-flight check has its own tests: tests/test_first_day2_disk_space.py)."""
    monkeypatch.setattr("packer.write.convert.check_room", lambda *args, **kwargs: None)


def test_disk_full_states_a_need_that_covers_the_real_one(
    tree: DemoTree, tmp_path: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BMP writes decoded pixels (~4× its JPEGs here): the need is estimated from the bytes
    written per input byte, not from the inputs' size."""
    _past_the_preflight_check(monkeypatch)
    reference = tmp_path / "ref.bmp"
    packer.convert(tree.root, reference, shard_size="10kB", workers=1, progress=False)
    subprocess.run(["mount", "-o", "remount,size=80k", str(small_disk)], check=True)
    dst = small_disk / "out.bmp"
    with pytest.raises(DestinationError, match="disk full") as caught:
        packer.convert(tree.root, dst, shard_size="10kB", workers=1, progress=False)
    partial = small_disk / "out.bmp.partial"
    real = _du(reference) - sum(
        p.lstat().st_size for p in partial.rglob("*") if p.is_file() and "_progress" not in p.parts
    )
    need = _needed(str(caught.value))
    print(f"BMP disk full: stated {need} B, really {real} B, source {tree_bytes(tree)} B")
    assert real <= need <= 2 * real + 8192


def tree_bytes(tree: DemoTree) -> int:
    return sum(p.stat().st_size for p in tree.root.rglob("*") if p.is_file())


def test_disk_full_during_finalization_states_the_tables_need(
    tree_files: Any, tree: DemoTree, tmp_path: Path, small_disk: Path
) -> None:
    """Every shard is written, then the disk fills: the need is the tables', never 0 B."""
    reference = tmp_path / "ref.lmdb"
    packer.convert(tree.root, reference, shard_size="1MB", workers=1, progress=False)
    subprocess.run(["mount", "-o", "remount,size=400k", str(small_disk)], check=True)
    filler = small_disk / "filler"

    def fill(name: str, number: int) -> None:
        if name == "tables":  # the tables are written, the manifest not yet: fill the disk
            with open(filler, "wb") as fh:
                with contextlib.suppress(OSError):
                    while True:
                        fh.write(b"\0" * 4096)
                        fh.flush()

    dst = small_disk / "out.lmdb"
    with pytest.raises(DestinationError, match="disk full") as caught:
        packer.convert(tree.root, dst, shard_size="1MB", workers=1, progress=False, on_event=fill)
    manifest = (reference / MANIFEST_NAME).stat().st_size
    assert _needed(str(caught.value)) >= manifest  # at least what is left: the manifest
    filler.unlink()
    packer.convert(tree.root, dst, shard_size="1MB", workers=1, resume=True, progress=False)
    assert tree_files(dst) == tree_files(reference)


def test_pool_workers_die_with_a_killed_parent(tmp_path: Path) -> None:
    """A conversion killed by SIGKILL leaves no pool worker behind (PR_SET_PDEATHSIG, no
    watching thread on Linux)."""
    code = (
        "import os, time\n"
        "from packer.write.loading import _executor\n"
        "pool = _executor(2, cpu_bound=True)\n"
        "futures = [pool.submit(time.sleep, 0.2) for _ in range(4)]\n"
        "[f.result() for f in futures]\n"
        "print(' '.join(str(p) for p in pool._processes), flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )  # fmt: skip
    assert child.stdout is not None
    workers = [int(p) for p in child.stdout.readline().split()]
    assert len(workers) == 2 and all(Path(f"/proc/{p}").exists() for p in workers)
    child.kill()
    child.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in workers), workers


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _h5py_loaded(batch: list[Any]) -> bool:
    import sys

    return "h5py" in sys.modules


def test_reading_hdf5_never_loads_the_hdf5_library(packed: dict[str, Path]) -> None:
    """An HDF5 dataset is read through the offsets recorded at conversion: a fresh worker
    (forkserver: the dataset pickled, nothing inherited but torch, imported in the forkserver)
    reading it never imports h5py (no HDF5 library state to inherit or to open, h5py#934)."""
    loader = DataLoader(
        packer.open_dataset(packed[".h5"], output="bytes"), batch_size=8, num_workers=1,
        collate_fn=_h5py_loaded, multiprocessing_context="forkserver",
    )  # fmt: skip
    assert set(loader) == {False}
