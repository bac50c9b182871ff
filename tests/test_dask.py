"""Distributed conversion with real components: a dask LocalCluster of worker processes, a worker
SIGKILLed mid-shard, ``--part I/N`` + ``packer merge``, and ``--resume`` of an interrupted run.
Every output is compared byte for byte with a local conversion of the same tree."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import packer
import packer.write.dask_client
from packer.cli.app import main
from packer.core.sizes import parse_size
from packer.demo.image import DemoTree, make_image_tree
from packer.errors import PackerError
from packer.source.images import scan
from packer.write.dask_client import dask_client
from packer.write.merge import merge
from packer.write.pipeline import plan_shards

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this file

SHARD = "20kB"
Files = Callable[[Path], dict[str, bytes]]


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """One LocalCluster (2 worker processes, 1 thread each) for the whole file."""
    with dask_client("local:2") as c:
        yield c


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> DemoTree:
    """3 classes × 6 JPEGs and a truncated one: several 20 kB shards."""
    return make_image_tree(
        tmp_path_factory.mktemp("dask") / "images", classes=3, per_class=6, size=(64, 48), bad=1
    )


@pytest.fixture(scope="module")
def local(source: DemoTree, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tree converted locally into every format, keyed by suffix (the reference bytes)."""
    out = tmp_path_factory.mktemp("local")
    return {
        suffix: packer.convert(
            source.root, out / f"images{suffix}", shard_size=SHARD, workers=2, progress=False
        ).dst
        for suffix in (".lmdb", ".npy", ".h5", ".bmp")
    }


def shards_of(root: Path) -> list[list[int]]:
    sizes = [s.size for s in scan(root).samples]
    shard_of, planned = plan_shards(sizes, parse_size(SHARD))
    return [[i for i, s in enumerate(shard_of.tolist()) if s == k] for k in range(len(planned))]


def test_cli_dask_local_equals_local(
    source: DemoTree, local: dict[str, Path], tmp_path: Path, tree_files: Files
) -> None:
    dst = tmp_path / "out.lmdb"
    args = ["convert", str(source.root), str(dst), "--shard-size", SHARD, "--dask", "local:2"]
    result = CliRunner().invoke(main, [*args, "-q"])
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output
    assert len(shards_of(source.root)) >= 3
    assert tree_files(dst) == tree_files(local[".lmdb"])


@pytest.mark.parametrize("suffix", [".lmdb", ".npy", ".h5", ".bmp"])
def test_every_format_same_bytes(
    client: Any,
    source: DemoTree,
    local: dict[str, Path],
    tmp_path: Path,
    tree_files: Files,
    suffix: str,
) -> None:
    dst = tmp_path / f"out{suffix}"
    packer.convert(source.root, dst, shard_size=SHARD, executor=client, progress=False)
    assert tree_files(dst) == tree_files(local[suffix])


def kill_once(marker: str, at: int) -> Callable[[str, int], None]:
    """An on_event hook that SIGKILLs its own worker process at sample ``at``, the first time."""

    def on_event(name: str, number: int) -> None:
        if name == "sample" and number == at and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)

    return on_event


def test_worker_killed_mid_shard_is_retried(
    client: Any, source: DemoTree, local: dict[str, Path], tmp_path: Path, tree_files: Files
) -> None:
    shard = shards_of(source.root)[1]
    assert len(shard) >= 2
    marker = tmp_path / "killed"
    hook = kill_once(str(marker), shard[0])  # the shard file is open, half written
    dst = tmp_path / "out.lmdb"
    packer.convert(
        source.root, dst, shard_size=SHARD, executor=client, progress=False, on_event=hook
    )
    assert marker.exists()  # a worker really died
    assert packer.verify(dst, progress=False).ok
    assert tree_files(dst) == tree_files(local[".lmdb"])


def fail_at(sample: int) -> Callable[[str, int], None]:
    def on_event(name: str, number: int) -> None:
        if name == "sample" and number == sample:
            raise RuntimeError(f"injected failure at sample {sample}")

    return on_event


def wait_idle(client: Any) -> None:
    """Let cancelled tasks still running on workers end (a running task cannot be stopped)."""
    deadline = time.monotonic() + 30
    while any(client.processing().values()) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_resume_keeps_complete_shards(
    client: Any, source: DemoTree, local: dict[str, Path], tmp_path: Path, tree_files: Files
) -> None:
    dst = tmp_path / "out.npy"
    with pytest.raises(RuntimeError, match="injected"):
        packer.convert(
            source.root, dst, shard_size=SHARD, executor=client, progress=False,
            on_event=fail_at(shards_of(source.root)[1][-1]),
        )  # fmt: skip
    wait_idle(client)
    partial = tmp_path / "out.npy.partial"
    kept = sorted(p.name for p in (partial / "_progress").glob("shard-*.json"))
    assert kept and "shard-00001.json" not in kept
    stamps = {name: (partial / name.replace(".json", ".npy")).stat().st_mtime_ns for name in kept}
    packer.convert(source.root, dst, shard_size=SHARD, executor=client, progress=False, resume=True)
    for name, stamp in stamps.items():
        assert (dst / name.replace(".json", ".npy")).stat().st_mtime_ns == stamp
    assert tree_files(dst) == tree_files(local[".npy"])


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, [*args, "-q"] if args[0] == "convert" else list(args))


def test_parts_then_merge_equal_one_run(
    source: DemoTree, local: dict[str, Path], tmp_path: Path, tree_files: Files
) -> None:
    dst = tmp_path / "out.h5"
    base = ["convert", str(source.root), str(dst), "--shard-size", SHARD]
    assert cli(*base, "--part", "1/2").exit_code == 0
    refused = cli("merge", str(dst))
    assert refused.exit_code == 1
    assert "out.h5.part-0" in refused.output and "missing" in refused.output
    assert cli(*base, "--part", "0/2").exit_code == 0
    merged = cli("merge", str(dst))
    assert merged.exit_code == 0, merged.output
    assert "merged 2 parts" in merged.output
    assert tree_files(dst) == tree_files(local[".h5"])
    assert not list(tmp_path.glob("out.h5.part-*"))


def test_merge_refuses_mismatched_and_incomplete_parts(source: DemoTree, tmp_path: Path) -> None:
    dst = tmp_path / "out.lmdb"
    packer.convert(source.root, dst, shard_size=SHARD, part=(0, 2), progress=False)
    packer.convert(source.root, dst, shard_size="10kB", part=(1, 2), progress=False)
    with pytest.raises(PackerError, match="not of the same conversion.*shard_size"):
        merge(dst)
    (tmp_path / "out.lmdb.part-1" / "part.json").unlink()  # as if killed before its end
    with pytest.raises(PackerError, match=r"missing or incomplete: .*out\.lmdb\.part-1"):
        merge(dst)
    with pytest.raises(PackerError, match="invalid part 2/2"):
        packer.convert(source.root, dst, part=(2, 2), progress=False)


def test_clear_errors(source: DemoTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packer.write.dask_client, "CONNECT_TIMEOUT", 1)
    result = cli(
        "convert", str(source.root), str(tmp_path / "o.lmdb"), "--dask", "tcp://127.0.0.1:9"
    )
    assert result.exit_code == 1
    assert "tcp://127.0.0.1:9" in result.output and "--dask local:2" in result.output
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if not installed
    result = cli("convert", str(source.root), str(tmp_path / "o.lmdb"), "--dask", "local:2")
    assert result.exit_code == 1 and "pip install 'packer-datasets[dask]'" in result.output
    assert "I/N" in cli("convert", str(source.root), str(tmp_path / "o.lmdb"), "--part", "x").output


@pytest.mark.parametrize("suffix", [".npy", ".h5", ".bmp", ".lmdb"])
def test_video_with_a_process_pool(tmp_path: Path, tree_files: Files, suffix: str) -> None:
    """The executor seam is any submit(): a process pool writes video in every layout (per-video
    NPY/HDF5 files, BMP frame files, LMDB shards) with the same bytes as a local run."""
    from concurrent.futures import ProcessPoolExecutor

    from packer.demo.video import make_video_tree

    frames = make_video_tree(tmp_path / "frames", classes=2, per_class=3, frames=(4, 9)).root
    one = packer.convert(frames, tmp_path / f"one{suffix}", shard_size="20kB", progress=False)
    with ProcessPoolExecutor(2) as pool:
        two = packer.convert(
            frames, tmp_path / f"two{suffix}", shard_size="20kB", progress=False, executor=pool
        )
    assert tree_files(two.dst) == tree_files(one.dst)
