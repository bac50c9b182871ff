"""Upload a conversion's shards while it runs, so that staging holds a few shards, not the
whole dataset (:func:`packer.upload.staging.convert_to_url`).

Each planned shard, once durable and checkpointed (the converter's ``after_shard`` hook), is
queued; a background thread sends the queued shards in order, up to :data:`IN_FLIGHT` at once
while their bytes stay under :data:`IN_FLIGHT_BYTES` (a shard file ≥ 16 MiB alone, multipart as
:class:`packer.upload.uploader.Uploader` does it; a group's per-sample files several at once), and then
*releases* each staged copy: a file of holes (no disk blocks) with its size and mtime is
renamed over it, in one step a kill cannot cut. So every step of the conversion that looks at
the staged output (sizes in the manifest, the published-output checks of ``--resume``, the
stale-object listing of the upload) sees the same tree as before, without its bytes.

Safety: a file is released only after its upload is checked (size, and the xxh3 of the bytes
sent against the checkpoint's) and journaled, and its journal line says so first, fsync'd
(:meth:`packer.upload.journal.Journal.release`). The final upload
skips it while the store holds the object as journaled, and refuses, naming it, if the store
lost it; a released copy is never sent. The converter never reads a finished shard again.

Bounded space: :meth:`ShardStream.after_shard` waits while the queued bytes would pass
``limit`` (so the conversion runs at the upload's pace), and the stream is drained before the
tables are written (the ``("tables", 0)`` event), so nothing is still being sent when the
output is published or its manifest uploaded. An upload failure stops the conversion with the
upload's error; ``--resume`` continues both.
"""

from __future__ import annotations

import os
import re
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from packer.errors import PackerError
from packer.upload.owned import sample_files
from packer.upload.uploader import LARGE, Uploader
from packer.write.pipeline import Event, Job
from packer.write.resume import Checkpoint

__all__ = ["ShardStream", "data_names", "release", "stream_limit"]

IN_FLIGHT = 4  # shards sent at once: one PUT at a time used under half of a 50 MB/s link
IN_FLIGHT_BYTES = 256 << 20  # ... while their bytes stay under this (s3fs holds a PUT's body)


def data_names(job: Job, checkpoint: Checkpoint) -> list[str]:
    """The data files of one checkpointed shard, relative to its output: the shard file, or
    (per-sample layouts) each written sample's file or files."""
    if checkpoint.shard is not None:
        return [checkpoint.shard.name]
    if job.layout != "per-sample":
        return []  # a shard whose every input was skipped
    counts = checkpoint.samples["count"].tolist()
    return sample_files(job.fmt, job.source.kind, checkpoint.keys, counts)


_SPARE = ".release-"  # + "<pid>-<thread>": a released copy being made, in the staging folder


def release(path: Path, st: os.stat_result, spare: Path) -> None:
    """Free the disk blocks of the uploaded ``path`` but keep its size and modification time
    (a file of holes), so it still looks as it was sent.

    In one step a kill cannot cut: the file of holes is made under a temporary name in the
    folder ``spare`` (same file system, outside the output) and renamed over ``path``, so the
    staged copy is either whole or released, never emptied with its size or mtime changed."""
    temp = spare / f"{_SPARE}{os.getpid()}-{threading.get_ident()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(temp, flags, st.st_mode & 0o777)
    try:
        os.ftruncate(fd, st.st_size)
        os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(fd)
    os.rename(temp, path)


def clear_spares(spare: Path) -> None:
    """Remove the temporaries of releases that a killed process left in ``spare``."""
    for entry in spare.glob(_SPARE + "*"):
        pid = entry.name[len(_SPARE) :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            entry.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Forward:
    """What a :class:`ShardStream` is in an executor's task: its caller's ``on_event``."""

    def __init__(self, user_event: Event | None) -> None:
        self.user_event = user_event

    def on_event(self, name: str, number: int) -> None:
        if self.user_event is not None:
            self.user_event(name, number)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


class ShardStream:
    """Send each finished shard of a conversion into ``local``'s upload as soon as it is
    checkpointed (see the module's docstring).

    Args:
        uploader: the upload; its :meth:`Uploader.begin` (which deletes an old dataset's
            manifests, with ``overwrite``) runs at the first finished shard, so a conversion
            that fails before it leaves the destination as it was.
        local: the local output being built (``<staging>/out.lmdb``); shards are found in its
            ``.partial`` folders.
        limit: the bytes of finished shards that may wait for their upload (at least one
            shard always may).
        on_event: the caller's own ``on_event``, still called.
    """

    def __init__(
        self,
        uploader: Uploader,
        local: Path,
        limit: int,
        overwrite: bool,
        on_event: Event | None = None,
    ) -> None:
        self.uploader, self.local, self.limit, self.user_event = uploader, local, limit, on_event
        self.overwrite, self._begun = overwrite, False
        self.uploaded = self.bytes = self.waiting = 0
        self._queue: deque[tuple[list[tuple[Path, str]], int]] = deque()
        self._cond = threading.Condition()
        self._sending: dict[int, int] = {}  # shards being sent: id of their files -> bytes
        self._error: BaseException | None = None
        self._sums: dict[str, str] = {}  # shard file -> the xxh3 its checkpoint records
        self._stopped = False
        clear_spares(local.parent)
        self._thread = threading.Thread(target=self._run, name="packer-upload", daemon=True)
        self._thread.start()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Sent to an executor's tasks (with ``--dask``, ``on_event`` runs there): only the
        caller's own ``on_event`` goes; the upload stays in this process."""
        return _Forward, (self.user_event,)

    def after_shard(self, job: Job, shard: int, checkpoint: Checkpoint) -> None:
        """Queue the data files of ``shard`` (built in ``job.partial``); wait while the bytes
        queued would pass the limit; raise the upload's error, if one failed."""
        if not self._begun:
            self.uploader.begin(self.overwrite, self.local)
            self._begun = True
        prefix = self._prefix(job.partial)
        files = [(job.partial / n, prefix + n) for n in data_names(job, checkpoint)]
        size = sum(local.stat().st_size for local, _ in files)
        if checkpoint.shard is not None:  # sent only if its bytes are the checkpoint's
            self._sums[prefix + checkpoint.shard.name] = checkpoint.shard.xxh3_64
        with self._cond:
            while self._error is None and self.waiting and self.waiting + size > self.limit:
                self._cond.wait()
            self._raise()
            self._queue.append((files, size))
            self.waiting += size
            self._cond.notify_all()

    def on_event(self, name: str, number: int) -> None:
        """The conversion's events: before its tables are written, wait for every queued
        upload (nothing is sent from a folder about to be published); then the caller's."""
        if name == "tables":
            self.drain()
        if self.user_event is not None:
            self.user_event(name, number)

    def drain(self) -> None:
        """Wait until every queued shard is uploaded and released; raise an upload's error."""
        with self._cond:
            while self._error is None and (self._queue or self._sending):
                self._cond.wait()
            self._raise()

    def close(self) -> None:
        """Stop the thread (after the file being sent); queued shards stay staged."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _prefix(self, partial: Path) -> str:
        """Where a (split's, a part's) partial folder's files go in the output: ``""`` or
        ``"train/"``."""
        parts = partial.relative_to(self.local.parent).parts
        names = [p.removesuffix(".partial") for p in parts]
        if re.fullmatch(re.escape(self.local.name) + r"\.part-\d+", names[0]):  # --part I/N
            names[0] = self.local.name
        if names[0] != self.local.name:
            raise PackerError(f"{str(partial)!r} is not inside the staged {str(self.local)!r}")
        return "".join(n + "/" for n in names[1:])

    def _startable(self) -> bool:
        """Whether the next queued shard may start: fewer than :data:`IN_FLIGHT` are being
        sent, and their bytes with it stay under :data:`IN_FLIGHT_BYTES` (or none is)."""
        if not self._queue or len(self._sending) >= IN_FLIGHT:
            return False
        return (
            not self._sending or sum(self._sending.values()) + self._queue[0][1] <= IN_FLIGHT_BYTES
        )

    def _run(self) -> None:
        with ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="packer-upload") as pool:
            while True:
                with self._cond:
                    while not (self._stopped or self._error or self._startable()):
                        self._cond.wait()
                    if self._stopped or self._error is not None:
                        return  # leaving the pool waits for the shards being sent
                    files, size = self._queue.popleft()
                    self._sending[id(files)] = size
                pool.submit(self._one, files, size)

    def _one(self, files: list[tuple[Path, str]], size: int) -> None:
        try:
            self._send(files)
        except BaseException as exc:  # handed to the converting thread
            with self._cond:
                self._error = self._error or exc
                self._cond.notify_all()
            return
        with self._cond:
            del self._sending[id(files)]
            self.waiting -= size
            self.uploaded += len(files)
            self.bytes += size
            self._cond.notify_all()

    def _send(self, files: list[tuple[Path, str]]) -> None:
        """Upload one shard's files (a large one alone, small ones several at once), then
        release each staged copy, journaled first."""
        large = [f[0].stat().st_size >= LARGE for f in files]
        sums = self._sums
        self.uploader.put_many([f for f, big in zip(files, large) if not big], _NoBar(), sums)
        for (local, name), big in zip(files, large):
            if big:  # one at a time: bounded memory
                self.uploader.put(local, name, _NoBar(), sums.get(name))
        journal = self.uploader.journal
        for local, name in files:
            st = local.stat()
            journal.release(name)
            release(local, st, self.local.parent)


def stream_limit(shard_size: int, given: Any = None) -> int:
    """The bytes of finished shards that may wait for upload: ``given`` (bytes, or a size such
    as ``"4GB"``), else four shards."""
    from packer.core.sizes import parse_size

    if given is not None:
        try:
            return parse_size(given)
        except PackerError as exc:
            raise PackerError(
                f"invalid staging limit {given!r} (--staging-limit): {exc}; give the bytes of "
                "finished shards that may wait for their upload, e.g. 4GB"
            ) from None
    return 4 * shard_size
