"""``packer`` commands in a real process of their own, traced by strace from the end of their
imports on: the kill-point tests' harness (tests/test_kill_points.py, test_upload_release_kills).

The process imports packer's command line (and ``preload``), says ``ready`` and waits; strace
attaches to it (``-f -p PID``: its threads and the threads and children it starts after), then
the process runs the command. strace stops a process at each of its system calls (with
``--seccomp-bpf`` only at the traced ones, but strace 6.1 delivers no injected signal then), and
an interpreter's start and imports are ~7,000 of a small conversion's ~8,000 calls: traced from
here a killed run costs 0.3 CPU-s instead of 0.7. A call's count (``--inject=...:when=N``) runs
from the attach, the same in a run that lists the calls and in the run killed at one; the
imports make none of the calls the tests kill at (fsync, rename, unlink, rmdir, utimensat: no
bytecode is written, ``PYTHONDONTWRITEBYTECODE``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

STRACE = shutil.which("strace")

WAIT_THEN_RUN = """
import importlib, sys
for name in sys.argv[1].split(","):
    importlib.import_module(name)
print("ready", flush=True)
sys.stdin.readline()
from packer.cli.app import main
sys.argv = ["packer", *sys.argv[2:]]
main()
"""


class Traced(NamedTuple):
    """The command's process: its exit (``-9`` when killed), output, and pid (its main
    thread's id in strace's lines)."""

    returncode: int
    stdout: str
    stderr: str
    pid: int


def traced(
    args: list[str],
    strace: list[str],
    env: Mapping[str, str],
    *,
    cwd: Path | None = None,
    preload: tuple[str, ...] = (),
    follow: bool = True,
    timeout: float = 300,
) -> Traced:
    """``packer ARGS`` in a process of its own, under ``strace -f STRACE`` from its imports on;
    ``follow=False``: its main thread alone (no ``-f``: the log's lines carry no thread id), for
    a process whose other threads make most of its calls (an upload's event loop)."""
    assert STRACE is not None, "strace is not installed: run `make test`, or apt-get install strace"
    modules = ",".join(("packer.cli.app", *preload))
    command = [sys.executable, "-c", WAIT_THEN_RUN, modules, *args]
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    with subprocess.Popen(command, env=dict(env), cwd=cwd, text=True, **pipes) as proc:
        assert proc.stdin and proc.stdout and proc.stderr
        ready = proc.stdout.readline()
        if ready != "ready\n":
            proc.kill()
            return Traced(proc.wait(), ready + proc.stdout.read(), proc.stderr.read(), proc.pid)
        attach = [STRACE, *(["-f"] if follow else []), *strace, "-p", str(proc.pid)]
        with subprocess.Popen(attach, stderr=subprocess.PIPE, text=True) as tracer:
            assert tracer.stderr is not None
            said = tracer.stderr.readline()  # "strace: Process N attached ...": traced now
            assert "attached" in said, said + tracer.stderr.read()
            try:
                out, err = proc.communicate("\n", timeout=timeout)
            finally:
                proc.kill()
                tracer.communicate(timeout=60)
        return Traced(proc.returncode, out, err, proc.pid)
