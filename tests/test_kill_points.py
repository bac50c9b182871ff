"""Deterministic kill points at every step of a conversion's end, with no hook in the product.

``strace --inject=SYSCALL:signal=KILL:when=N`` kills the real ``packer convert`` process at its
N-th ``rename``/``unlink``/``unlinkat``/``rmdir``/``fsync`` (counted per thread: the main
thread's, which does the end; a decoder library probe runs a compiler in child processes). A
first traced run lists the calls made from the first table write on (finalization: tables, manifest, ``_progress/`` removal,
publication, lock removal); then, for each of them, a run is killed there and both ``--resume``
and a plain rerun (on a copy of what the kill left) must give an output identical to an
uninterrupted conversion, with no leftover (``.partial``, ``.partial.lock``, ``.old-<pid>``).
LMDB goes through every kill point; when ``--overwrite`` replaces an old output, and for the
other formats and video, every rename (each a step of the sequence) and the first, middle and
last call of each other kind.

Only the killed run and the traced run are processes of their own (what is attacked: a real
kill of a real ``packer convert``), each traced from the end of its imports on (the calls
counted from there in both: tests/strace_kill.py); the reference, ``--resume`` and the plain rerun are the same
CLI run in this process (0.02 CPU-s instead of a 0.3 s interpreter start each). Each scenario's
points are traced once per xdist worker and split into ``PARTS`` test items, spread by xdist.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner
from strace_kill import STRACE, Traced, traced

import packer
from packer.cli.app import main
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.read.describe import inspect_dict
from packer.read.verify import verify


@pytest.fixture(autouse=True)
def _strace() -> None:
    """These tests never skip: `make test` installs strace (the Makefile's `tools` step)."""
    assert STRACE is not None, "strace is not installed: run `make test`, or apt-get install strace"


CALLS = ("rename", "unlink", "unlinkat", "rmdir", "fsync")
ROOT = str(Path(__file__).resolve().parents[1])


def args(src: Path, dst: Path, *extra: str) -> list[str]:
    return ["convert", str(src), str(dst), "-q", "--workers", "1", "--shard-size", "6kB", *extra]


class Ran(NamedTuple):
    returncode: int
    stderr: str


def run(src: Path, dst: Path, *extra: str) -> Ran:
    """The same CLI conversion as :func:`cli`, in this process (no kill aims at it)."""
    done = CliRunner().invoke(main, args(src, dst, *extra))
    error = done.exception
    crash = "" if error is None or isinstance(error, SystemExit) else repr(error)
    return Ran(done.exit_code, done.stderr + crash)


def cli(src: Path, dst: Path, *extra: str, trace: list[str]) -> Traced:
    """``packer convert`` in a process of its own, under ``strace TRACE`` from its imports on
    (tests/strace_kill.py): each call counted from there, in the listing and the killed run."""
    env = {"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    return traced(args(src, dst, *extra), trace, env, cwd=dst.parent)


def kill_points(
    src: Path, work: Path, name: str, extra: tuple[str, ...], first: str = "index"
) -> list[tuple[str, int]]:
    """(syscall, N) for every call of ``CALLS`` a conversion makes from its first table on
    (``first``: the table's path in the output; a root of splits: ``val.partial/index``, its
    last split's)."""
    log = work / "trace.log"
    if extra:  # --overwrite: the end replaces an existing output
        assert run(src, work / name).returncode == 0
    calls = ",".join(("openat", *CALLS))
    done = cli(src, work / name, *extra, trace=["-o", str(log), "-e", f"trace={calls}"])
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    main = str(done.pid)  # strace counts calls per thread: only the main one's matter
    counts: Counter[str] = Counter()
    points, started = [], False
    for line in lines:
        match = re.match(r"(\d+)\s+(\w+)\(", line)
        if match is None or match.group(1) != main:
            continue
        call = match.group(2)
        started = started or (call == "openat" and f"{name}.partial/{first}" in line)
        if call in CALLS:
            counts[call] += 1
            if started:
                points.append((call, counts[call]))
    assert started and len(points) > 10, "the trace must see the finalization"
    shutil.rmtree(work)
    return points


def sample(points: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Every rename (a step of the sequence each: tables, manifest, publication) and the first,
    middle and last kill point of each other syscall."""
    chosen = []
    for call in CALLS:
        mine = [p for p in points if p[0] == call]
        if call == "rename":
            chosen += mine
        elif mine:
            chosen += sorted({mine[0], mine[len(mine) // 2], mine[-1]}, key=lambda p: p[1])
    return chosen


def leftovers(folder: Path, name: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != name and p.name.startswith(name))


def check_kill_point(
    files: Any, src: Path, ref: Path, work: Path, name: str, point: tuple[str, int], extra: tuple
) -> None:
    work.mkdir()
    dst = work / name
    if extra:
        assert run(src, dst).returncode == 0
    call, n = point
    killed = cli(
        src,
        dst,
        *extra,
        trace=["-o", "/dev/null", "-e", f"trace={call}", f"--inject={call}:signal=KILL:when={n}"],
    )
    assert killed.returncode == -9, (point, killed.returncode, killed.stderr)
    plain = work.with_name(work.name + "-plain")
    shutil.copytree(work, plain, symlinks=True)
    resumed = run(src, dst, *extra, "--resume")
    assert resumed.returncode == 0, (point, resumed.stderr)
    assert files(dst) == files(ref), point
    assert leftovers(work, name) == [], point
    pdst = plain / name
    complete = (plain / f"{name}.partial" / "packer.json").is_file()
    published = pdst.is_dir() and not (plain / f"{name}.partial").exists()
    again = run(src, pdst, *extra)
    if complete or extra:
        assert again.returncode == 0, (point, again.stderr)
        assert files(pdst) == files(ref), point
        assert leftovers(plain, name) == [], point
    elif published:
        assert "exists; pass --overwrite" in again.stderr, (point, again.stderr)
        assert files(pdst) == files(ref), point
        assert leftovers(plain, name) == [], point  # the dead writer's lock swept even so
    else:  # interrupted before the manifest: only --resume (or --overwrite) goes on
        assert "add --resume" in again.stderr, (point, again.stderr)
    shutil.rmtree(work)
    shutil.rmtree(plain)


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes × 2 small JPEGs: two planned shards at 6 kB."""
    root = tmp_path_factory.mktemp("kill") / "images"
    return make_image_tree(root, classes=2, per_class=2, size=(64, 48), bad=0).root


@dataclass
class Scenario:
    """A source, its uninterrupted output (``ref``) and the kill points of its conversion."""

    src: Path
    name: str
    ref: Path
    extra: tuple[str, ...]
    points: list[tuple[str, int]]


def _scenario(kind: str, small: Path, work: Path) -> Scenario:
    src, name, extra, first = small, "o.lmdb", (), "index"
    if kind == "lmdb-overwrite":
        extra = ("--overwrite",)
    elif kind == "video.npy":
        src = make_video_tree(work / "frames", classes=2, per_class=2, frames=(3, 4)).root
        name = "o.npy"
    elif kind == "splits":
        src, name, first = work / "imagenet", "o.npy", "val.partial/index"
        for split in ("train", "val"):
            shutil.copytree(small, src / split)
    elif kind != "lmdb":
        name = "o" + kind
    ref = work / "ref" / name
    ref.parent.mkdir()
    assert run(src, ref).returncode == 0
    (work / "probe").mkdir()
    found = kill_points(src, work / "probe", name, extra, first=first)
    if kind == "lmdb":  # every kill point of a fresh LMDB conversion
        points = found
    elif kind == "splits":  # every rename from the last split's tables on, the last of the rest
        last = {call: n for call, n in found}  # the last of each call: the end of the sequence
        points = [(c, n) for c, n in found if c == "rename" or last[c] == n]
    else:  # the replacement's end (the same calls plus the old output's), other formats: a sample
        points = sample(found)
    print(f"{kind}: {len(points)} kill points {Counter(c for c, _ in points)}")
    return Scenario(src, name, ref, extra, points)


@pytest.fixture(scope="module")
def scenarios(small: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``scenarios(kind)``: that scenario, traced once in this (xdist worker) process."""
    made: dict[str, Scenario] = {}

    def get(kind: str) -> Scenario:
        if kind not in made:
            made[kind] = _scenario(kind, small, tmp_path_factory.mktemp(f"kill-{kind}"))
        return made[kind]

    return get


def check_part(files: Any, scenario: Scenario, tmp_path: Path, part: int, parts: int) -> None:
    """Every ``parts``-th kill point of ``scenario`` from the ``part``-th: killed, recovered."""
    mine = scenario.points[part::parts]
    assert len(scenario.points) >= parts and mine, scenario.points
    for i, point in enumerate(mine):
        work = tmp_path / f"k{i}"
        check_kill_point(
            files, scenario.src, scenario.ref, work, scenario.name, point, scenario.extra
        )


PARTS = {"lmdb": 6, "lmdb-overwrite": 3}


@pytest.mark.parametrize("part", range(PARTS["lmdb"]))
def test_every_lmdb_kill_point_recovers(
    tree_files: Any, scenarios: Any, tmp_path: Path, part: int
) -> None:
    scenario = scenarios("lmdb")
    kinds = {call for call, _ in scenario.points}
    assert {"rename", "unlink", "rmdir", "fsync"} <= kinds
    check_part(tree_files, scenario, tmp_path, part, PARTS["lmdb"])
    assert verify(scenario.ref, progress=False).ok


@pytest.mark.parametrize("part", range(PARTS["lmdb-overwrite"]))
def test_sampled_lmdb_overwrite_kill_points_recover(
    tree_files: Any, scenarios: Any, tmp_path: Path, part: int
) -> None:
    scenario = scenarios("lmdb-overwrite")
    kinds = {call for call, _ in scenario.points}
    assert {"rename", "unlink", "rmdir", "fsync"} <= kinds
    check_part(tree_files, scenario, tmp_path, part, PARTS["lmdb-overwrite"])


@pytest.mark.parametrize("part", range(2))
@pytest.mark.parametrize("suffix", [".h5", ".npy", ".bmp", "video.npy"])
def test_sampled_kill_points_recover(
    tree_files: Any, scenarios: Any, tmp_path: Path, suffix: str, part: int
) -> None:
    scenario = scenarios(suffix)
    assert len(packer.open_dataset(scenario.ref)) == 4
    check_part(tree_files, scenario, tmp_path, part, 2)


@pytest.mark.parametrize("part", range(3))
def test_kill_points_of_a_root_of_splits_recover(
    tree_files: Any, scenarios: Any, tmp_path: Path, part: int
) -> None:
    """A root of splits ends with its last split's tables, manifest and rename into place, then
    the top manifest, then the publication: a kill at every rename from the last split's
    tables on, and at the last of each other call, recovers by --resume and by a plain rerun
    (this test found a finished, unpublished root of splits refused by --resume, and a
    published one refused as "exists" by --resume)."""
    scenario = scenarios("splits")
    assert inspect_dict(scenario.ref)["splits"]["val"]["samples"] == 4
    check_part(tree_files, scenario, tmp_path, part, 3)


def first_points(src: Path, work: Path, name: str, fingerprints: tuple[str, ...]) -> list:
    """(syscall, N) of the first fsync, the first rename and the fsync after it from the open of
    each of ``fingerprints`` (``_progress/fingerprint.json.tmp`` paths in the output) on: the
    first write of a progress fingerprint, before any checkpoint."""
    log = work / "trace.log"
    calls = ",".join(("openat", *CALLS))
    done = cli(src, work / name, trace=["-o", str(log), "-e", f"trace={calls}"])
    assert done.returncode == 0, done.stderr
    lines = log.read_text().splitlines()
    main = str(done.pid)
    counts: Counter[str] = Counter()
    points: list[tuple[str, int]] = []
    wanted: list[str] = []
    for line in lines:
        match = re.match(r"(\d+)\s+(\w+)\(", line)
        if match is None or match.group(1) != main:
            continue
        call = match.group(2)
        if call == "openat" and any(f"{name}.partial/{f}" in line for f in fingerprints):
            wanted = ["fsync", "rename", "fsync"]
        if call in CALLS:
            counts[call] += 1
            if wanted and call == wanted[0]:
                points.append((call, counts[call]))
                wanted.pop(0)
    assert len(points) == 3 * len(fingerprints), points
    shutil.rmtree(work)
    return points


@pytest.fixture(scope="module")
def before_checkpoint(small: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``before_checkpoint(splits)``: (src, name, ref, points) of the first fingerprint writes,
    traced once in this (xdist worker) process."""
    made: dict[bool, tuple[Path, str, Path, list[tuple[str, int]]]] = {}

    def get(splits: bool) -> tuple[Path, str, Path, list[tuple[str, int]]]:
        if splits not in made:
            work = tmp_path_factory.mktemp("first-splits" if splits else "first-one")
            src, name, fingerprints = small, "o.lmdb", ("_progress/fingerprint.json.tmp",)
            if splits:
                src, name = work / "imagenet", "o.npy"
                for split in ("train", "val"):
                    shutil.copytree(small, src / split)
                fingerprints += ("train.partial/_progress/fingerprint.json.tmp",)
            ref = work / "ref" / name
            ref.parent.mkdir()
            assert run(src, ref).returncode == 0
            (work / "probe").mkdir()
            made[splits] = (src, name, ref, first_points(src, work / "probe", name, fingerprints))
        return made[splits]

    return get


@pytest.mark.parametrize(
    "extra", [(), ("--resume",), ("--overwrite",)], ids=["plain", "resume", "overwrite"]
)
@pytest.mark.parametrize("splits", [False, True], ids=["one", "splits"])
def test_a_kill_before_the_first_checkpoint_starts_afresh(
    tree_files: Any, before_checkpoint: Any, tmp_path: Path, splits: bool, extra: tuple[str, ...]
) -> None:
    """Issue 28, 10: a kill at the first fsync or rename of the progress fingerprint left a
    ``.partial`` that a plain run called "interrupted: add --resume", ``--resume`` called "no
    resumable progress" and ``--overwrite`` "not a packer output": a loop. A ``.partial`` with
    no checkpoint holds nothing worth keeping: a plain run and ``--resume`` start it afresh.
    For a root of splits: a kill at its own first fingerprint likewise; one at its first
    split's leaves the root's fingerprint (a root that a plain run asks to --resume, as any
    started root) and an unstarted split, which --resume starts afresh."""
    src, name, ref, points = before_checkpoint(splits)
    for i, (call, n) in enumerate(points):
        work = tmp_path / f"k{i}"
        work.mkdir()
        inject = f"--inject={call}:signal=KILL:when={n}"
        killed = cli(src, work / name, trace=["-o", "/dev/null", "-e", f"trace={call}", inject])
        assert killed.returncode == -9, (call, n, killed.stderr)
        assert (work / f"{name}.partial").is_dir() and not (work / name).exists()
        again = run(src, work / name, *extra)
        if i >= 3 and not extra:  # a split's: the root holds its fingerprint and the split
            assert "add --resume" in again.stderr, (call, n, again.stderr)
            again = run(src, work / name, "--resume")
        assert again.returncode == 0, (call, n, extra, again.stderr)
        assert tree_files(work / name) == tree_files(ref), (call, n, extra)
        assert leftovers(work, name) == [], (call, n, extra)
        shutil.rmtree(work)


def test_a_partial_packer_did_not_write_or_a_live_writer_is_still_refused(
    small: Path, tmp_path: Path
) -> None:
    """The fresh start takes only what packer's first fingerprint write leaves (``_progress/``
    with ``fingerprint.json.tmp`` or the fingerprint itself): a ``.partial`` holding anything
    else is refused as before and left as it is, and one a live writer holds is refused."""
    dst = tmp_path / "o.lmdb"
    partial = tmp_path / "o.lmdb.partial"
    (partial / "_progress").mkdir(parents=True)
    (partial / "_progress" / "fingerprint.json.tmp").write_bytes(b"{")
    (partial / "notes.txt").write_text("mine")
    for extra, says in (((), "add --resume"), (("--resume",), "no resumable progress")):
        refused = run(small, dst, *extra)
        assert refused.returncode == 1 and says in refused.stderr, refused.stderr
        assert (partial / "notes.txt").read_text() == "mine"
    (partial / "notes.txt").unlink()
    holder = subprocess.Popen(  # a live writer: holds DST.partial.lock (20 s at most)
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(tmp_path / 'o.lmdb.partial.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'4242')\n"
            "print('held', flush=True); sys.stdin.read(); time.sleep(0)",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        for extra in ((), ("--resume",)):
            busy = run(small, dst, *extra)
            assert busy.returncode == 1 and "process 4242" in busy.stderr, busy.stderr
            assert (partial / "_progress" / "fingerprint.json.tmp").read_bytes() == b"{"
    finally:
        holder.communicate("", timeout=20)
    assert run(small, dst).returncode == 0 and not partial.exists()
