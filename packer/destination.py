"""Where a conversion writes: destination checks, one writer per destination, atomic
publication, disk-full reports.

The source is sacred: a destination equal to, inside or containing the source is refused
before any work, and ``--overwrite`` only ever deletes a packer output (a folder with our
manifest or our progress checkpoint), never an arbitrary folder.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from pathlib import Path
from types import TracebackType

from packer.errors import DestinationError
from packer.manifest import MANIFEST_NAME, fsync_dir
from packer.sizes import format_size

__all__ = [
    "DestinationLock",
    "check_destination",
    "disk_full_error",
    "is_packer_output",
    "partial_path",
    "publish",
]

PROGRESS_MARK = Path("_progress") / "fingerprint.json"


def partial_path(dst: Path) -> Path:
    """The folder a conversion builds ``dst`` in."""
    return dst.with_name(dst.name + ".partial")


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
    """Refuse a destination that would harm the source, that exists (without ``overwrite``,
    and then only if packer wrote it), whose interrupted conversion would be silently discarded,
    or that cannot be created."""
    if src is not None:
        _check_apart(src, dst)
    if dst.exists() or dst.is_symlink():
        if not overwrite:
            raise DestinationError(
                f"destination {str(dst)!r} exists; pass --overwrite to replace it"
            )
        _check_replaceable(dst, "destination")
    partial = partial_path(dst)
    if (partial.exists() or partial.is_symlink()) and not resume:
        if not overwrite:
            raise DestinationError(
                f"{str(partial)!r} holds an interrupted conversion: add --resume to continue "
                "it, or --overwrite to start over"
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

    def __init__(self, dst: Path) -> None:
        self.path = dst.with_name(dst.name + ".partial.lock")
        self.fd = -1

    def __enter__(self) -> DestinationLock:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise DestinationError(f"cannot create {str(self.path)!r}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            dst = str(self.path)[: -len(".partial.lock")]
            raise DestinationError(
                f"{dst!r} is being written by another conversion (process {holder}); wait for "
                "it to finish or stop it first"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

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
            shutil.rmtree(old)
        else:
            old.unlink()


def disk_full_error(partial: Path, total_bytes: int) -> DestinationError:
    """The error for a full disk: how much more is needed, what is free, how to go on."""
    free = shutil.disk_usage(partial.parent).free
    written = sum(f.stat().st_size for f in partial.rglob("*") if f.is_file())
    needed = max(total_bytes - written, 0)
    return DestinationError(
        f"disk full while writing {str(partial)!r}: about {format_size(needed)} more is needed "
        f"and {format_size(free)} is free. The finished shards are kept: free space, then run "
        "the same command with --resume"
    )
