"""The conversion's overlapping stages: shards finished in the background while the next is
written, batched pool tasks, the scan check at 1/8 scale in a process pool, the writers' heap.
Every output is compared byte for byte with a one-worker (all on one thread) conversion."""

from __future__ import annotations

import functools
import io
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

import packer
from packer.decode.check import _eighth, check_image
from packer.demo.image import DemoTree, photo_like
from packer.errors import InputFileError
from packer.source.images import scan
from packer.write.loading import Loaded, load_image, load_in_order
from packer.write.overlap import ShardFinisher
from packer.write.plan import plan_conversion


class Stop(Exception):
    """Raised by the progress hook."""


def test_shards_are_finished_off_the_writing_thread(tree: DemoTree, tmp_path: Path) -> None:
    threads: dict[str, set[str]] = {"sample": set(), "shard": set()}

    def note(name: str, number: int) -> None:
        threads.setdefault(name, set()).add(threading.current_thread().name)

    dst = tmp_path / "out.lmdb"
    packer.convert(tree.root, dst, shard_size="10kB", workers=2, progress=False, on_event=note)
    assert threads["sample"] == {threading.current_thread().name}
    assert threads["shard"] and threading.current_thread().name not in threads["shard"]
    threads.clear()
    packer.convert(tree.root, tmp_path / "one.lmdb", shard_size="10kB", workers=1, progress=False,
                   on_event=note)  # fmt: skip
    assert threads["shard"] == {threading.current_thread().name}  # one worker: one thread


@pytest.mark.parametrize("suffix", [".lmdb", ".npy", ".h5", ".bmp"])
def test_an_error_finishing_a_shard_in_the_background_stops_the_run(
    tree: DemoTree, tmp_path: Path, tree_files: Any, suffix: str
) -> None:
    reference = tmp_path / f"reference{suffix}"
    packer.convert(tree.root, reference, shard_size="10kB", workers=1, progress=False)

    def stop(name: str, number: int) -> None:
        if (name, number) == ("shard", 1):
            raise Stop

    dst = tmp_path / f"out{suffix}"
    with pytest.raises(Stop):
        packer.convert(tree.root, dst, shard_size="10kB", workers=3, progress=False, on_event=stop)
    assert not dst.exists() and dst.with_name(dst.name + ".partial").is_dir()
    packer.convert(tree.root, dst, shard_size="10kB", workers=3, progress=False, resume=True)
    assert tree_files(dst) == tree_files(reference)


def test_the_finisher_raises_a_finish_error_and_waits_for_the_last() -> None:
    done: list[int] = []

    def fail() -> None:
        raise Stop

    with pytest.raises(Stop), ShardFinisher(background=True) as finisher:
        finisher.submit(fail)
        finisher.submit(lambda: done.append(1))  # waits for the one before: raises its error
    assert done == []
    with ShardFinisher(background=True) as finisher:
        finisher.submit(lambda: done.append(2))
    assert done == [2]  # leaving waited for it
    with pytest.raises(Stop), ShardFinisher(background=True) as finisher:
        finisher.submit(fail)  # the last one's error surfaces on leaving
    with pytest.raises(KeyError), ShardFinisher(background=True) as finisher:
        finisher.submit(fail)
        raise KeyError("the caller's own error wins")


def _failing_loader(bad: set[str], sample: Any) -> Loaded:
    if sample.path in bad:
        raise ZeroDivisionError("a library's corner case")
    return load_image(sample, check="fast")


@pytest.mark.parametrize("cpu_bound", [False, True])
def test_batched_loading_keeps_the_order_and_each_samples_result(
    tree: DemoTree, cpu_bound: bool
) -> None:
    samples = scan(tree.root).samples
    loader = functools.partial(_failing_loader, {samples[5].path})
    one = list(load_in_order(loader, samples, 1, cpu_bound))
    for batch_bytes in (0, 1, 3000, 1 << 20):
        got = list(load_in_order(loader, samples, 2, cpu_bound, batch_bytes))
        assert [(r.records, r.reason) for r in got] == [(r.records, r.reason) for r in one]
    assert one[5].reason == "unexpected error: ZeroDivisionError: a library's corner case"
    assert one[4].records == [Path(samples[4].path).read_bytes()]


def test_the_scan_check_decodes_at_one_eighth_and_still_walks_the_stream() -> None:
    import numpy as np

    for size in [(400, 350), (500, 375), (64, 48), (17, 9), (7, 5), (1, 1)]:
        out = io.BytesIO()
        photo_like(np.random.default_rng(0), *size).save(out, format="JPEG", quality=90)
        with Image.open(io.BytesIO(out.getvalue())) as image:
            image.draft(image.mode, _eighth(image.size))
            if min(size) >= 8:  # libjpeg's smallest scale (a side under 8 px: at most 1/4)
                assert image.size == tuple(-(-side // 8) for side in size)
        data = out.getvalue()
        check_image(data, "scan")
        half = len(data) // 2  # a marker mid-scan: only a walk of the stream sees it
        if size[0] >= 64:
            with pytest.raises(InputFileError, match="broken image"):
                check_image(data[:half] + b"\xff\xd0\xff\xda" + data[half + 4 :], "scan")


def test_a_decoding_check_runs_in_a_process_pool(tree: DemoTree, tmp_path: Path) -> None:
    jobs = {
        check: plan_conversion(tree.root, tmp_path / f"{check}.lmdb", check=check).job()
        for check in ("fast", "scan", "decode")
    }
    assert {check: job.cpu_bound for check, job in jobs.items()} == {
        "fast": False,
        "scan": True,
        "decode": True,
    }


HEAP = """
import ctypes, sys
from packer.write.overlap import keep_heap_for_writes
print(keep_heap_for_writes(), keep_heap_for_writes())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_writers_heap_setting_is_applied_once_and_can_be_refused() -> None:
    root = str(Path(__file__).resolve().parents[1])

    def run(**env: str) -> str:
        environ = {k: v for k, v in os.environ.items() if k != "PACKER_NO_MALLOPT"}
        cmd = [sys.executable, "-c", HEAP]
        return subprocess.run(
            cmd, capture_output=True, text=True, env={**environ, "PYTHONPATH": root, **env}
        ).stdout.strip()

    assert run() == "True True"
    assert run(PACKER_NO_MALLOPT="1") == "False False"
