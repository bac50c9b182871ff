"""The shard cache's own rules, without a server: where it lives, its limit, and locks that die
with their process (a real subprocess holds one and is SIGKILLed)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.cli.app import main
from packer.core.file_locks import lock, release
from packer.errors import PackerError
from packer.remote.cache import ShardCache, default_cache_dir, parse_limit


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("PACKER_CACHE_DIR")
    assert default_cache_dir() == tmp_path / "xdg" / "packer"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == tmp_path / "home" / ".cache" / "packer"
    assert ShardCache().dir == tmp_path / "home" / ".cache" / "packer"


def test_limits() -> None:
    assert parse_limit(None) is None
    assert parse_limit("200GB") == 200 * 10**9
    assert parse_limit("500MiB") == 500 * 2**20
    assert parse_limit(12345) == 12345
    for bad in ("lots", "0", -1, 1.5, True):
        with pytest.raises(PackerError, match="size|cache_limit"):
            parse_limit(bad)  # type: ignore[arg-type]
    cache = ShardCache("x", "1kB")
    cache.check_fits(1000, "a shard")
    with pytest.raises(PackerError, match=r"cache_limit=1000 bytes .* smaller than a shard"):
        cache.check_fits(1001, "a shard")


HANG = 300.0  # a hang guard, never reached by a slow run


def _wait_blocked_on(inode: int) -> None:
    """Until a process waits in ``flock`` on the file ``inode`` (a ``->`` line of /proc/locks):
    the kernel's own record of the wait, not a sleep long enough on an idle machine."""
    deadline = time.monotonic() + HANG
    while True:
        with open("/proc/locks") as fh:
            waits = [line.split() for line in fh if " -> " in line]
        if any(w[6].rsplit(":", 1)[1] == str(inode) for w in waits if len(w) > 6):
            return
        assert time.monotonic() < deadline, f"no wait on inode {inode} after {HANG:.0f} s"
        time.sleep(0.01)


def test_a_lock_unlinked_while_waiting_is_not_kept(tmp_path: Path) -> None:
    """An evictor unlinks a lock file it holds: a process that waited on that file locks the
    new one, never the removed one (else two processes would each hold "the" lock)."""
    path = tmp_path / "k.lock"
    evictor = lock(path, fcntl.LOCK_EX)
    got: list[int | None] = []
    waiter = threading.Thread(target=lambda: got.append(lock(path, fcntl.LOCK_SH)))
    waiter.start()
    _wait_blocked_on(path.stat().st_ino)  # the waiter has opened the old file and waits on it
    os.unlink(path)
    os.close(evictor)  # type: ignore[arg-type]
    waiter.join(HANG)
    assert got and got[0] is not None
    assert os.fstat(got[0]).st_ino == os.stat(path).st_ino
    os.close(got[0])


def test_a_part_unlinked_as_it_is_opened_is_not_refused(tmp_path: Path) -> None:
    """Processes racing for one download: each locks ``K.part``, finds the object finished and
    unlinks the part. One that opened the part just before its unlink sees a file with no link
    left: gone, not planted (a planted hard link has two), so it locks the path anew instead of
    refusing the cache (a cached DataLoader epoch failed on it, benchmarks/remote.py)."""
    path = tmp_path / "k.part"
    failed: list[BaseException] = []

    def racer() -> None:
        try:
            for _ in range(400):
                fd = lock(path, fcntl.LOCK_EX)
                assert fd is not None and os.fstat(fd).st_nlink == 1
                path.unlink(missing_ok=True)
                release(fd)
        except BaseException as exc:  # noqa: BLE001 - reported below
            failed.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failed == []


def test_a_forked_child_keeps_no_lock(tmp_path: Path) -> None:
    """A process forked (a DataLoader worker) while its parent holds a lock (a download in
    progress) must not keep that lock once the parent releases it: waiters would hang for as
    long as the child lives."""
    path = tmp_path / "k.part"
    fd = lock(path, fcntl.LOCK_EX)
    assert fd is not None
    ready, started = os.pipe()
    child = os.fork()
    if child == 0:  # the worker (its fork hooks have run): lives on, never touches the lock
        os.write(started, b"1")
        time.sleep(5)
        os._exit(0)
    try:
        assert os.read(ready, 1) == b"1"
        release(fd)  # the parent's download is done
        assert lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB) is not None  # free for the others
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        os.close(ready)
        os.close(started)


_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_SH)
print("held", flush=True)
time.sleep(60)
"""


def _entry(cache: Path, key: str, size: int) -> None:
    cache.mkdir(exist_ok=True)
    (cache / f"{key}.data").write_bytes(b"x" * size)
    (cache / f"{key}.json").write_text(json.dumps({"url": f"s3://b/{key}"}))


def test_a_holder_killed_frees_its_objects(tmp_path: Path) -> None:
    """A process reading an object keeps it from eviction and ``clear``; SIGKILLed, it holds
    nothing (the flock died with it): nothing to clean by hand, no restart blocked."""
    cache = tmp_path / "cache"
    a, b = "a" * 32, "b" * 32
    _entry(cache, a, 10)
    _entry(cache, b, 20)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(cache / f"{a}.lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        shards = ShardCache(cache, limit=25)
        assert {e.key: e.in_use for e in shards.entries()} == {a: True, b: False}
        shards._make_room(10)  # 30 + 10 > 25: only b may go
        assert [e.key for e in shards.entries()] == [a]
        removed, skipped = shards.clear()
        assert removed == [] and [e.key for e in skipped] == [a]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
    removed, skipped = ShardCache(cache).clear()
    assert [e.key for e in removed] == [a] and skipped == []
    assert sorted(p.name for p in cache.iterdir()) == [".evict.lock"]


def test_cache_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    for args in (["cache", "--help"], ["cache", "ls", "--help"], ["cache", "clear", "--help"]):
        assert runner.invoke(main, args).exit_code == 0
    empty = runner.invoke(main, ["cache", "ls", "--cache-dir", str(tmp_path / "none"), "--json"])
    assert json.loads(empty.output) == {
        "cache_dir": str(tmp_path / "none"),
        "entries": [],
        "bytes": 0,
    }
    _entry(tmp_path / "c", "c" * 32, 1234)
    listed = runner.invoke(main, ["cache", "ls", "--cache-dir", str(tmp_path / "c"), "--json"])
    (entry,) = json.loads(listed.output)["entries"]
    assert entry["url"] == f"s3://b/{'c' * 32}" and entry["bytes"] == 1234
    assert not entry["in_use"] and not entry["partial"]
    text = runner.invoke(main, ["cache", "ls", "--cache-dir", str(tmp_path / "c")]).output
    assert "1 objects, 1.2 kB" in text and "idle" in text
