"""Where a conversion writes: destination checks, one writer per destination, atomic
publication, disk-full reports.

The source is sacred: a destination equal to, inside or containing the source is refused
before any work, and ``--overwrite`` only ever deletes a packer output (a folder with our
manifest or our progress checkpoint), never an arbitrary folder.

The end of a conversion is a sequence whose every state a kill can leave is recognised
(:mod:`packer.finish` decides what to do with each):

1. ``DST.partial/`` holds the shards, tables and (last) ``packer.json``, with ``_progress/``;
2. ``_progress/`` is emptied, its ``fingerprint.json`` last, then removed;
3. an old ``DST`` (``--overwrite``) is renamed ``DST.old-<pid>``, ``DST.partial`` renamed ``DST``;
4. ``DST.old-<pid>`` is deleted, then ``DST.partial.lock``.

After 1, ``DST.partial`` is *complete-but-unpublished*: ``--resume`` or a plain rerun with the
same options publishes it. After 3, ``--resume`` answers "complete". Leftovers of a dead
writer (its ``.partial.lock``, a ``DST.old-<pid>``) are removed by the next run that takes
the lock; nothing is left for the user to delete.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from packer.errors import DestinationError
from packer.manifest import MANIFEST_NAME, fsync_dir
from packer.resume import Progress
from packer.sizes import format_size

__all__ = [
    "DestinationLock",
    "check_destination",
    "disk_full_error",
    "is_packer_output",
    "lock_holder",
    "partial_path",
    "publish",
]

PROGRESS_MARK = Path("_progress") / "fingerprint.json"
_HELD: set[str] = set()  # the lock files this process holds


def partial_path(dst: Path) -> Path:
    """The folder a conversion builds ``dst`` in."""
    return dst.with_name(dst.name + ".partial")


def lock_path(dst: Path) -> Path:
    """The lock file of ``dst``'s one writer."""
    return dst.with_name(dst.name + ".partial.lock")


def lock_holder(dst: Path) -> str | None:
    """The pid of the live process writing ``dst`` (``"?"`` if it has not written it yet), or
    None if no other process holds the lock (a lock file left by a dead writer is not held:
    the kernel released its ``flock``)."""
    path = lock_path(dst)
    if str(path) in _HELD:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def busy_error(dst: Path, holder: str) -> DestinationError:
    """The refusal for a destination a live process is writing."""
    return DestinationError(
        f"{str(dst)!r} is being written by another conversion (process {holder}); wait for it "
        f"to finish or stop it first (its {str(partial_path(dst))!r} is in use: leave it alone)"
    )


def _old_copies(dst: Path) -> list[Path]:
    """``DST.old-<pid>`` folders: an old output :func:`publish` set aside and did not delete."""
    parent = dst.parent if str(dst.parent) else Path(".")
    prefix = dst.name + ".old-"
    try:
        names = [n for n in os.listdir(parent) if n.startswith(prefix)]
    except OSError:
        return []
    return [parent / n for n in names if n[len(prefix) :].isdigit()]


def clear_leftovers(dst: Path) -> None:
    """Delete what a dead writer of ``dst`` left: old outputs set aside by :func:`publish`
    (a packer output, or the empty folder a kill left at the end of its removal). Call with
    ``dst``'s lock held (only a lock holder creates them)."""
    for old in _old_copies(dst):
        if old.is_symlink() or not old.is_dir():
            continue
        if is_packer_output(old) or not any(old.iterdir()):
            remove_output(old)


def remove_output(path: Path) -> None:
    """Delete a packer output, its manifest last: until the folder is gone it stays
    recognisable as ours (then empty)."""
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files:
            if not (name == MANIFEST_NAME and root == str(path)):
                os.unlink(os.path.join(root, name))
        for name in dirs:
            full = os.path.join(root, name)
            os.unlink(full) if os.path.islink(full) else os.rmdir(full)
    (path / MANIFEST_NAME).unlink(missing_ok=True)
    os.rmdir(path)


def _sweep(dst: Path) -> None:
    """Remove a dead writer's lock file and leftovers (nothing if a live process holds it)."""
    if str(lock_path(dst)) in _HELD or not (lock_path(dst).exists() or _old_copies(dst)):
        return
    try:
        with DestinationLock(dst, attempts=1):
            clear_leftovers(dst)
    except DestinationError:
        pass


def is_packer_output(path: Path) -> bool:
    """Whether ``path`` is a folder packer wrote: a complete output or an interrupted one."""
    return path.is_dir() and ((path / MANIFEST_NAME).is_file() or (path / PROGRESS_MARK).is_file())


def _check_apart(src: Path, dst: Path) -> None:
    source, target = src.resolve(), dst.resolve()
    for place in (target, partial_path(target)):
        if place == source:
            raise DestinationError(
                f"destination {str(dst)!r} is the source itself; choose a destination outside "
                f"{str(src)!r}"
            )
        if source in place.parents:
            raise DestinationError(
                f"destination {str(dst)!r} is inside the source {str(src)!r}: it would be "
                "scanned as data and mixed with it; choose a destination outside the source"
            )
        if place in source.parents:
            raise DestinationError(
                f"destination {str(dst)!r} contains the source {str(src)!r}: replacing it would "
                "delete your data; choose another destination"
            )


def _check_replaceable(path: Path, what: str) -> None:
    if path.is_symlink() or not path.is_dir():
        raise DestinationError(
            f"{what} {str(path)!r} is not a folder packer wrote; refusing to replace it. "
            "Remove it yourself or choose another destination"
        )
    if not is_packer_output(path) and any(path.iterdir()):
        raise DestinationError(
            f"{what} {str(path)!r} is not a packer output (no {MANIFEST_NAME}); refusing to "
            "delete it. Remove it yourself or choose another destination"
        )


def check_destination(
    dst: Path, overwrite: bool, src: Path | None = None, resume: bool = False
) -> None:
    """Refuse a destination that would harm the source, that a live process is writing (naming
    it), that exists (without ``overwrite``, and then only if packer wrote it), whose
    interrupted conversion would be silently discarded, or that cannot be created.

    A complete output (``DST`` with ``resume``, or a complete ``DST.partial``) passes: whether
    it is the same conversion is decided once the lock is held (:mod:`packer.finish`)."""
    if src is not None:
        _check_apart(src, dst)
    holder = lock_holder(dst)
    if holder is not None:
        raise busy_error(dst, holder)
    _sweep(dst)
    try:
        _check_existing(dst, overwrite, resume)
    except DestinationError:
        holder = lock_holder(dst)  # a writer that started meanwhile explains what was seen
        if holder is not None:
            raise busy_error(dst, holder) from None
        raise


def _check_existing(dst: Path, overwrite: bool, resume: bool) -> None:
    partial = partial_path(dst)
    has_partial = partial.exists() or partial.is_symlink()
    if dst.exists() or dst.is_symlink():
        if not overwrite and not (resume and not has_partial and is_packer_output(dst)):
            raise DestinationError(
                f"destination {str(dst)!r} exists; pass --overwrite to replace it"
            )
        if overwrite:
            _check_replaceable(dst, "destination")
    if has_partial and not resume:
        if not overwrite:
            if (partial / MANIFEST_NAME).is_file() and not partial.is_symlink():
                return  # complete but unpublished: published if it is the same conversion
            raise DestinationError(
                f"{str(partial)!r} holds an interrupted conversion (no process is writing "
                "it): add --resume to continue it, or --overwrite to start over"
            )
        _check_replaceable(partial, "folder")
    parent = dst.parent if str(dst.parent) else Path(".")
    if not parent.is_dir():
        raise DestinationError(f"cannot create {str(dst)!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DestinationError(
            f"cannot create {str(dst)!r}: folder {str(parent)!r} is not writable"
        )


class DestinationLock:
    """One writer per destination: an exclusive ``flock`` on ``DST.partial.lock`` held from the
    first check to the publication. A second conversion names the process holding it; the lock
    of a process that died is released by the kernel, so the next run simply takes it."""

    def __init__(self, dst: Path, attempts: int = 5) -> None:
        self.dst = dst
        self.path = lock_path(dst)
        self.fd = -1
        self.attempts = attempts  # a brief shared probe (lock_holder) is waited out

    def __enter__(self) -> DestinationLock:
        for attempt in range(self.attempts):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                if attempt + 1 == self.attempts:
                    raise busy_error(self.dst, holder) from None
                time.sleep(0.02)
                continue
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a file a finishing writer unlinked after we opened it
                break
            os.close(fd)
        else:
            raise busy_error(self.dst, "?")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        _HELD.add(str(self.path))
        return self

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise DestinationError(f"cannot create {str(self.path)!r}: {exc.strerror}") from exc

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.fd < 0:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                self.path.unlink()
        except OSError:
            pass
        _HELD.discard(str(self.path))
        os.close(self.fd)
        self.fd = -1


def publish(partial: Path, dst: Path) -> None:
    """Move the finished ``partial`` into place, replacing an old ``dst`` only at the end."""
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.with_name(dst.name + f".old-{os.getpid()}")
        os.replace(dst, old)
    os.replace(partial, dst)
    fsync_dir(dst.parent if str(dst.parent) else Path("."))
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            remove_output(old)
        else:
            old.unlink()


def _written(partial: Path) -> tuple[int, int]:
    """Bytes on disk in ``partial``: (data files, tables and manifest); progress not counted."""
    data = tables = 0
    for root, dirs, files in os.walk(partial):
        if Path(root) == partial:
            dirs[:] = [d for d in dirs if d != "_progress"]
        for name in files:
            try:
                size = os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if Path(root) == partial and name.split(".")[0] in _TABLE_STEMS:
                tables += size
            else:
                data += size
    return data, tables


_TABLE_STEMS = {"index", "records", "keys", "packer"}


def estimate_need(partial: Path, source: Any) -> tuple[int, str]:
    """How many more bytes ``partial`` needs to be complete, and how that was estimated: the
    data still to write at the ratio of bytes written per input byte in the finished shards
    (BMP writes pixels: ~10× its JPEG inputs), plus the tables (16 bytes a sample, 24 a
    record, the keys, ~4 kB of manifest) not yet written. Without a finished shard, the source's
    size stands for the data (said so: a transcoding format needs more)."""
    done = Progress(partial).finished()
    keys = {k for c in done for k in c.keys}
    dropped = {s["path"] for c in done for s in c.skipped}
    inputs_done = sum(s.size for s in source.samples if s.key in keys or s.path in dropped)
    records = sum(len(c.records) for c in done)
    per_sample = records / len(keys) if keys else 1.0
    n = len(source.samples)
    key_bytes = sum(len(os.fsencode(s.key)) + 1 for s in source.samples)
    data, tables_written = _written(partial)
    manifest = 4096 + sum(len(c) + 8 for c in source.classes) + 256 * len(source.skipped)
    tables = 16 * n + int(24 * per_sample * n) + key_bytes + manifest
    tables_left = max(tables - tables_written, 0)
    if inputs_done == 0:
        need = max(source.total_bytes - data, 0) + tables_left
        return need, (
            "an estimate from the inputs' size: no shard is finished yet, and a format that "
            "transcodes (bmp, npy with --size) writes more than it reads"
        )
    ratio = data / inputs_done
    need = max(int(ratio * source.total_bytes) - data, 0) + tables_left
    return need, (
        f"an estimate: {ratio:.2f} bytes written per input byte so far, plus "
        f"{format_size(tables_left)} of tables"
    )


def disk_full_error(partial: Path, source: Any) -> DestinationError:
    """The error for a full disk: how much more is needed (an estimate, said so), what is free,
    how to go on."""
    free = shutil.disk_usage(partial.parent).free
    need, how = estimate_need(partial, source)
    return DestinationError(
        f"disk full while writing {str(partial)!r}: about {format_size(need)} more is needed "
        f"({how}) and {format_size(free)} is free. The finished shards are kept: free space, "
        "then run the same command with --resume"
    )
