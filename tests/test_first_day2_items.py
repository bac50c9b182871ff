"""Issue 42 item 5, the smaller first-day items: a checkout named ``packer/`` seen from its parent,
an unfinished ``DST.partial`` opened, ``verify`` into a log file, ``diagnose`` on a loaded machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main

ROOT = Path(__file__).resolve().parents[1]


def test_a_folder_named_packer_in_the_current_directory_does_not_shadow_the_package(
    tmp_path: Path,
) -> None:
    """A user who clones into ./packer and runs Python from the parent folder: the checkout
    folder (no __init__.py) must not become an empty namespace package (make install installs
    in compat editable mode: a path entry, which a regular package wins from)."""
    (tmp_path / "packer").symlink_to(ROOT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import packer; print(packer.convert.__module__, packer.__file__)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("packer.write.convert ")


@pytest.fixture
def unfinished(tmp_path: Path) -> Path:
    """A conversion stopped before its end: DST.partial with shards and no packer.json."""

    def boom(i: int) -> Any:
        if i == 30:
            raise KeyboardInterrupt  # stops the run as Ctrl-C would: DST.partial is kept
        return {"txt": f"{i:050d}"}

    with pytest.raises(KeyboardInterrupt):
        packer.pack(
            range(40), tmp_path / "x.lmdb", boom, workers=1, shard_size="200B", progress=False
        )
    assert (tmp_path / "x.lmdb.partial").is_dir()
    return tmp_path


def test_opening_an_unfinished_output_says_what_it_is(unfinished: Path) -> None:
    with pytest.raises(packer.FormatError, match="unfinished conversion or write.*--resume"):
        packer.open_dataset(unfinished / "x.lmdb.partial")
    with pytest.raises(packer.PackerError, match="x.lmdb' does not exist: .*x.lmdb.partial' holds"):
        packer.open_dataset(unfinished / "x.lmdb")
    shown = CliRunner().invoke(main, ["inspect", str(unfinished / "x.lmdb.partial")])
    assert (
        shown.exit_code == 1
        and "unfinished" in shown.output
        and "class folders" not in shown.output
    )


def test_opening_a_part_says_to_merge(tmp_path: Path) -> None:
    packer.pack(
        range(4), tmp_path / "p.npy", lambda i: {"cls": i}, part=(0, 2), workers=1, progress=False
    )
    with pytest.raises(packer.FormatError, match="part 0 of 'p.npy'.*packer merge"):
        packer.open_dataset(tmp_path / "p.npy.part-0")


def test_verify_writes_no_progress_bar_into_a_log_file(tmp_path: Path) -> None:
    packer.pack(range(50), tmp_path / "v.lmdb", lambda i: {"cls": i}, workers=1, progress=False)
    log = tmp_path / "log.txt"
    with open(log, "wb") as out:
        done = subprocess.run(
            [sys.executable, "-m", "packer", "verify", str(tmp_path / "v.lmdb")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            timeout=120,
        )
    text = log.read_text()
    assert done.returncode == 0 and "OK" in text
    assert "\r" not in text and "it/s" not in text and "sample/s" not in text, text


COST = """
import os, signal
from packer.diagnosis.diagnose import sample_cost

class Work:  # a CPU-bound sample (~40 ms, longer than a time slice): no storage at all
    def __len__(self):
        return 40
    def __getitem__(self, i):
        return sum(k * k for k in range(600_000))

class Loader:
    dataset, batch_size = Work(), None

os.sched_setaffinity(0, {0})
hogs = []
for _ in range(3):  # three busy loops on the same CPU, started once the imports are done
    pid = os.fork()
    if pid == 0:
        while True:
            pass
    hogs.append(pid)
try:
    print(sample_cost(Loader(), count=6).cpu_share)
finally:
    for pid in hogs:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
"""


def test_a_loaded_cpu_is_not_counted_as_storage_wait(tmp_path: Path) -> None:
    """Three busy loops share CPU 0 with the measuring process: a CPU-bound sample still has a
    CPU share near 1 (the run-queue wait is left out); counted as waiting, it read ~0.25 and
    advised more workers than CPUs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", COST], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) > 0.7, done.stdout
