"""``packer.pack`` killed for real (SIGKILL) and resumed: the same bytes as a run never stopped.

The job packs 60 inputs into small shards; some inputs fail (skipped and listed), some are left
out (``None``), some give three samples (a shard boundary then falls inside one input's samples).
Kill points: the N-th ``fsync`` of the packing process (``strace --inject``, spread over the
whole run: shard files, pack state, checkpoints, tables, manifest), and inside ``fn`` at chosen
inputs (the process kills itself). Each killed run is resumed with ``workers=2`` — so a resume in
parallel must also give the single-process bytes — and compared file by file.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = str(Path(__file__).resolve().parents[1])
STRACE = shutil.which("strace")

JOB = """
import os, signal, sys
import numpy as np
import packer

KILL_AT = int(os.environ.get("KILL_AT", "-1"))

def fn(i):
    if i == KILL_AT:
        os.kill(os.getpid(), signal.SIGKILL)
    if i % 7 == 3:
        raise ValueError(f"input {i} is broken")
    if i % 11 == 5:
        return None
    sample = {"npy": np.full((i % 4 + 1, 3), i, np.int16), "txt": "x" * (i % 13)}
    return [dict(sample), dict(sample), dict(sample)] if i % 5 == 0 else sample

if __name__ == "__main__":
    dst, workers, resume = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "resume"
    packer.pack(range(60), dst, fn, workers=workers, resume=resume, shard_size="600B",
                progress=False)
"""

FSYNC_FRACTIONS = (0.02, 0.15, 0.3, 0.42, 0.55, 0.68, 0.8, 0.9, 0.97, 1.0)
FN_KILLS = (1, 26, 55)


@pytest.fixture(autouse=True)
def _strace() -> None:
    assert STRACE is not None, "strace is not installed: run `make test`, or apt-get install strace"


def _run(
    job: Path,
    dst: Path,
    workers: int,
    mode: str,
    *,
    kill_at: int = -1,
    trace: list[str] | None = None,
) -> Any:
    cmd = [sys.executable, str(job), str(dst), str(workers), mode]
    if trace is not None:
        cmd = [str(STRACE), "-qq", *trace, *cmd]
    env = {"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin", "KILL_AT": str(kill_at)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job, its uninterrupted output's files and how many fsyncs its process makes."""
    root = tmp_path_factory.mktemp("pack-kills")
    job = root / "job.py"
    job.write_text(JOB)
    log = root / "fsyncs.log"
    done = _run(job, root / "ref.lmdb", 1, "plain", trace=["-e", "trace=fsync", "-o", str(log)])
    assert done.returncode == 0, done.stderr
    fsyncs = sum(1 for line in log.read_text().splitlines() if line.startswith("fsync("))
    assert fsyncs > 40, fsyncs  # many shards, each with its state and checkpoint
    return {"job": job, "ref": root / "ref.lmdb", "fsyncs": fsyncs}


def _resume_and_compare(reference: dict[str, Any], dst: Path, tree_files: Any) -> None:
    partial = dst.with_name(dst.name + ".partial")
    assert not dst.exists() or not partial.exists()
    done = _run(reference["job"], dst, 2, "resume")
    assert done.returncode == 0, done.stderr
    assert not partial.exists()
    assert tree_files(dst) == tree_files(reference["ref"])


@pytest.mark.parametrize("fraction", FSYNC_FRACTIONS)
def test_killed_at_an_fsync_and_resumed_gives_the_same_bytes(
    reference: dict[str, Any], tmp_path: Path, tree_files: Any, fraction: float
) -> None:
    point = max(1, round(reference["fsyncs"] * fraction))
    dst = tmp_path / "out.lmdb"
    inject = [f"--inject=fsync:signal=KILL:when={point}", "-e", "trace=fsync", "-o", "/dev/null"]
    killed = _run(reference["job"], dst, 1, "plain", trace=inject)
    assert killed.returncode != 0  # the kill happened (strace reports the signal)
    assert not dst.exists() or fraction == 1.0
    _resume_and_compare(reference, dst, tree_files)


@pytest.mark.parametrize("kill_at", FN_KILLS)
def test_killed_inside_fn_and_resumed_gives_the_same_bytes(
    reference: dict[str, Any], tmp_path: Path, tree_files: Any, kill_at: int
) -> None:
    dst = tmp_path / "out.lmdb"
    killed = _run(reference["job"], dst, 1, "plain", kill_at=kill_at)
    assert killed.returncode == -9
    assert not dst.exists()
    _resume_and_compare(reference, dst, tree_files)
