"""Where a conversion writes: destination checks, atomic publication, disk-full reports."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from packer.errors import DestinationError
from packer.manifest import fsync_dir
from packer.sizes import format_size

__all__ = ["check_destination", "disk_full_error", "partial_path", "publish"]


def partial_path(dst: Path) -> Path:
    """The folder a conversion builds ``dst`` in."""
    return dst.with_name(dst.name + ".partial")


def check_destination(dst: Path, overwrite: bool) -> None:
    """Refuse a destination that exists (without ``overwrite``) or cannot be created."""
    if dst.exists() and not overwrite:
        raise DestinationError(f"destination {str(dst)!r} exists; pass --overwrite to replace it")
    parent = dst.parent if str(dst.parent) else Path(".")
    if not parent.is_dir():
        raise DestinationError(f"cannot create {str(dst)!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DestinationError(
            f"cannot create {str(dst)!r}: folder {str(parent)!r} is not writable"
        )


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
