"""Output a user can trust: plain progress lines in logs, Ctrl-C says the exact --resume command."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from packer.tools.image_demo import DemoTree
from packer.verify import verify


def default_sigint() -> None:
    """A test runner started in the background (``cmd &``) ignores SIGINT, and so would the
    child it starts: give the child Python's ordinary Ctrl-C back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_progress_in_a_log_has_no_carriage_returns(tree: DemoTree, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "packer", "convert", str(tree.root), str(tmp_path / "o.lmdb")]
    done = subprocess.run(cmd, capture_output=True, text=True)  # stderr is a pipe, not a tty
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr
    assert (
        f"convert → lmdb: {len(tree.good) + len(tree.bad)}/{len(tree.good) + len(tree.bad)} img"
        in done.stderr
    )


SLOW_CLI = """
import sys, time
import packer.write
real = packer.write.end_shard
def slow(*args, **kwargs):
    time.sleep(0.4)
    return real(*args, **kwargs)
packer.write.end_shard = slow
from packer.cli import main
sys.argv = ["packer", *sys.argv[1:]]
main()
"""


def test_ctrl_c_prints_the_resume_command(tree: DemoTree, tmp_path: Path) -> None:
    dst = tmp_path / "out.npy"
    args = ["convert", str(tree.root), str(dst), "--shard-size", "5kB", "-q"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_CLI, *args],
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    checkpoint = tmp_path / "out.npy.partial" / "_progress" / "shard-00001.json"
    deadline = time.monotonic() + 60
    while not checkpoint.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    resume_line = next(line for line in err.splitlines() if line.strip().endswith("--resume"))
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "packer",
            "convert",
            str(tree.root),
            str(dst),
            "--shard-size",
            "5kB",
            "-q",
        ],
        capture_output=True,
        text=True,
    )
    assert again.returncode == 1 and "add --resume" in again.stderr + again.stdout
    assert (tmp_path / "out.npy.partial").is_dir()  # hours of work are not deleted
    words = shlex.split(resume_line.strip())
    assert words[:2] == ["packer", "convert"]
    finish = subprocess.run(
        [sys.executable, "-m", "packer", *words[1:]], capture_output=True, text=True
    )
    assert finish.returncode == 0, finish.stderr
    assert verify(dst, progress=False).ok
