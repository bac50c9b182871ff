"""Output a user can trust: plain progress lines in logs, Ctrl-C says the exact --resume command."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from packer.demo.image import DemoTree, make_image_tree
from packer.read.verify import verify


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
import packer.write.pipeline
real = packer.write.pipeline.end_shard
def slow(*args, **kwargs):
    time.sleep(0.4)
    return real(*args, **kwargs)
packer.write.pipeline.end_shard = slow
from packer.cli.app import main
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


BUGGY_CLI = """
import sys
import packer.read.describe
def broken(*args, **kwargs):
    raise RuntimeError("boom\\nsecond line")
packer.read.describe.describe = broken
from packer.cli.app import main
sys.argv = ["packer", *sys.argv[1:]]
main()
"""


def test_a_bug_is_one_line_and_status_2(tree: DemoTree, tmp_path: Path) -> None:
    dst = tmp_path / "o.npy"
    converted = subprocess.run(
        [sys.executable, "-m", "packer", "convert", str(tree.root), str(dst), "-q"],
        capture_output=True,
    )
    assert converted.returncode == 0, converted.stderr
    done = subprocess.run(
        [sys.executable, "-c", BUGGY_CLI, "inspect", str(dst)], capture_output=True, text=True
    )
    assert done.returncode == 2  # not 1: a test expecting a refusal still sees the bug
    assert done.stderr == (
        "internal error: RuntimeError: boom second line (please report it; PACKER_DEBUG=1 "
        "shows the traceback)\n"
    )
    debug = subprocess.run(
        [sys.executable, "-c", BUGGY_CLI, "inspect", str(dst)],
        capture_output=True,
        text=True,
        env={**os.environ, "PACKER_DEBUG": "1"},
    )
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "boom" in debug.stderr


def test_names_that_are_not_utf8_print(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_image_tree(src, classes=1, per_class=2, size=(64, 48), bad=0)
    folder = next(p for p in src.iterdir() if p.is_dir())
    first = sorted(folder.iterdir())[0]
    os.rename(first, os.path.join(os.fsencode(folder), b"caf\xe9.jpg"))
    dst = tmp_path / "o.lmdb"
    for args in (["convert", str(src), str(dst), "-q"], ["inspect", str(dst)]):
        done = subprocess.run(
            [sys.executable, "-m", "packer", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONIOENCODING": "utf-8"},
        )
        assert done.returncode == 0, done.stderr
    assert "caf\\udce9" in done.stdout  # the undecodable byte, escaped
