"""A streamed upload killed while it releases a staged copy (issue 28, finding 1).

Releasing a copy empties it (two truncates) and restores its mtime; ``strace`` kills the real
``packer convert SRC s3://...`` process at each of those calls, so the staged copy is left empty
or zero-filled with a new mtime. ``--resume`` must then finish with the objects equal to a local
conversion's: a half-released copy is recognised as released (the store keeps the object sent
from it), and no upload sends bytes whose xxh3 differs from what the manifest or the journal
records. Real moto S3 server, real s3fs client, real kills.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from s3_server import S3Server
from strace_kill import traced
from test_remote_write import assert_same_dataset, files, objects

import packer
from packer.cli.app import main
from packer.demo.image import make_image_tree
from packer.errors import DestinationError
from packer.upload.staging import convert_to_url, staging_folder

BUCKET = "releases"
PRELOAD = ("s3fs", "packer.upload.staging")  # imported before the trace starts
ROOT = str(Path(__file__).resolve().parents[1])
SHARD = "4kB"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("release_src")
    return make_image_tree(root / "images", classes=2, per_class=8, size=(64, 48), bad=0).root


def cli(
    server: S3Server,
    src: Path,
    url: str,
    staging: Path,
    *extra: str,
    trace: str = "",
    strace_log: tuple[Path, str] | None = None,
    follow: bool = True,
) -> Any:
    """``packer convert SRC URL`` in a real process, traced from the end of its imports on
    (tests/strace_kill.py); ``trace``: killed by strace at that call; ``strace_log``: (log,
    calls) traced into the log; ``follow=False``: its main thread alone (the upload's event
    loop makes most calls of the process, untraced then; the releases are another thread's)."""
    cmd = ["convert", str(src), url, "-q", "--workers", "1"]
    cmd += ["--shard-size", SHARD, "--staging", str(staging), "--staging-limit", "1"]
    cmd += ["--storage-option", f"endpoint_url={server.endpoint}", *extra]
    if trace:
        call = trace.split(":")[0]
        strace = ["-o", "/dev/null", "-e", f"trace={call}", f"--inject={trace}:signal=KILL"]
    else:
        assert strace_log is not None
        strace = ["-o", str(strace_log[0]), "-e", f"trace={strace_log[1]}"]
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONDONTWRITEBYTECODE="1")
    return traced(cmd, strace, env, preload=PRELOAD, follow=follow)


def run(server: S3Server, src: Path, url: str, staging: Path, *extra: str) -> Any:
    """The same ``packer convert SRC URL`` as :func:`cli`, in this process (no kill aims at it:
    the run after one); ``returncode`` and ``stderr`` as a process's."""
    args = ["convert", str(src), url, "-q", "--workers", "1", "--shard-size", SHARD]
    args += ["--staging", str(staging), "--staging-limit", "1"]
    args += ["--storage-option", f"endpoint_url={server.endpoint}", *extra]
    done = CliRunner().invoke(main, args)
    error = done.exception
    crash = "" if error is None or isinstance(error, SystemExit) else repr(error)
    return subprocess.CompletedProcess(args, done.exit_code, done.stdout, done.stderr + crash)


@pytest.mark.parametrize(
    ("name", "point"),
    [
        ("out.lmdb", "utimensat:when=1"),  # the file of holes made, its mtime being set
        ("out.lmdb", "utimensat:when=3"),  # a later shard's
        ("out.bmp", "utimensat:when=1"),  # per-sample files
    ],
)
def test_resume_after_a_kill_inside_a_release_publishes_the_real_bytes(
    server: S3Server, source: Path, tmp_path: Path, name: str, point: str
) -> None:
    stem, suffix = name.split(".")
    url = f"s3://{BUCKET}/{stem}-{point.split(':')[0]}{point[-1]}.{suffix}"
    staging = tmp_path / "staging"
    killed = cli(server, source, url, staging, trace=point)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    journal = (
        staging_folder(url, staging, {"endpoint_url": server.endpoint}) / "upload-journal.jsonl"
    )
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    assert any(e.get("released") for e in lines), "the kill came inside a release"
    resumed = run(server, source, url, staging, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    local = tmp_path / name
    packer.convert(source, local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))
    assert sorted(p.name for p in staging.iterdir()) == [], "staging removed, no temporaries"


@pytest.mark.parametrize("name", ["out.lmdb", "out.bmp"])
def test_a_copy_left_half_released_is_known_as_released(
    server: S3Server, source: Path, tmp_path: Path, name: str
) -> None:
    """The states an interrupted release could leave (before releases were one rename): a copy
    marked released in the journal but emptied to 0 bytes, or zero-filled with a new mtime.
    ``--resume`` keeps the objects the store holds and publishes the real bytes."""
    stem, suffix = name.split(".")
    url, staging = f"s3://{BUCKET}/{stem}-half.{suffix}", tmp_path / "staging"
    killed = cli(server, source, url, staging, trace="utimensat:when=3")
    assert killed.returncode == -9, killed.stderr[-2000:]
    folder = staging_folder(url, staging, {"endpoint_url": server.endpoint})
    lines = [
        json.loads(line) for line in (folder / "upload-journal.jsonl").read_text().splitlines()
    ]
    released = sorted({e["name"] for e in lines if e.get("released")})
    assert len(released) >= 2, released
    partial = folder / f"{stem}-half.{suffix}.partial"
    emptied, zeroed = partial / released[0], partial / released[1]
    if suffix == "bmp":  # per-sample sizes are read off the files: a copy kept its size
        emptied.write_bytes(bytes(emptied.stat().st_size))
    else:
        emptied.write_bytes(b"")
    zeroed.write_bytes(bytes(zeroed.stat().st_size))  # its size, a new mtime
    resumed = run(server, source, url, staging, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    local = tmp_path / name
    packer.convert(source, local, shard_size=SHARD, workers=1, progress=False)
    expected = files(local)
    assert_same_dataset(objects(server, url), expected)


def test_an_upload_never_sends_a_staged_copy_that_differs_from_its_checksum(
    server: S3Server, source: Path, tmp_path: Path
) -> None:
    """A staged shard damaged after its checkpoint (zero-filled in place, size and mtime kept,
    as a release cut short or a disk fault leaves it) is refused by name, not published: the
    store is left without a manifest."""
    url, staging = f"s3://{BUCKET}/damaged.lmdb", tmp_path / "staging"
    common = dict(
        storage_options={"endpoint_url": server.endpoint},
        staging=staging,
        shard_size=SHARD,
        workers=1,
        progress=False,
    )
    folder = staging_folder(url, staging, {"endpoint_url": server.endpoint})

    def damage_first_shard(event: str, number: int) -> None:
        if event == "tables":
            shard = sorted(folder.glob("*.partial/shard-*.mdb"))[0]
            st = shard.stat()
            shard.write_bytes(bytes(st.st_size))
            os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))

    with pytest.raises(DestinationError, match=r"shard-00000.*checksum"):
        convert_to_url(source, url, keep_staging=True, on_event=damage_first_shard, **common)
    assert "packer.json" not in objects(server, url)


def removal_points(server: S3Server, source: Path, url: str, staging: Path, log: Path) -> list:
    """(syscall, N) of the main thread's last unlink/unlinkat/rmdir calls: the staging folder's
    removal after a finished upload."""
    calls = "unlink,unlinkat,rmdir"
    done = cli(server, source, url, staging, trace="", strace_log=(log, calls), follow=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = log.read_text().splitlines()  # the main thread's calls only (no thread ids)
    counts: dict[str, int] = {}
    points = []
    for line in lines:
        match = re.match(r"(\w+)\(", line)
        if match and match.group(1) in calls.split(","):
            counts[match.group(1)] = counts.get(match.group(1), 0) + 1
            points.append((match.group(1), counts[match.group(1)]))
    return points[-6:]


def test_a_kill_while_the_staging_folder_is_removed_never_blocks_the_next_run(
    server: S3Server, source: Path, tmp_path: Path
) -> None:
    """Killed at each of the last calls that remove a finished upload's staging folder (its
    mark among them), the next run is never refused as "not a packer staging folder": it
    replaces the dataset with --overwrite and leaves no staging folder."""
    url = f"s3://{BUCKET}/removed.lmdb"
    points = removal_points(server, source, url, tmp_path / "trace", tmp_path / "trace.log")
    assert len(points) == 6, points
    for n, (call, when) in enumerate(points):
        staging = tmp_path / f"staging-{n}"
        at = f"{call}:when={when}"  # the main thread's, as listed
        killed = cli(server, source, url, staging, "--overwrite", trace=at, follow=False)
        assert killed.returncode == -9, (call, when, killed.stderr[-2000:])
        again = run(server, source, url, staging, "--overwrite")
        assert again.returncode == 0, (call, when, again.stderr[-2000:])
        assert not any(staging.iterdir()), (call, when, list(staging.rglob("*")))
    local = tmp_path / "local.lmdb"
    packer.convert(source, local, shard_size=SHARD, workers=1, progress=False)
    assert_same_dataset(objects(server, url), files(local))
