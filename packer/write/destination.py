"""Where a conversion writes: destination checks, one writer per destination, atomic
publication, the recognition of a dead writer's leftovers.

The source is sacred: a destination equal to, inside or containing the source is refused
before any work, and ``--overwrite`` only ever deletes a packer output (a folder with our
manifest or our progress checkpoint), never an arbitrary folder.

The end of a conversion is a sequence whose every state a kill can leave is recognised
(:mod:`packer.write.finish` decides what to do with each):

1. ``DST.partial/`` holds the shards, tables and (last) ``packer.json``, with ``_progress/``;
2. ``_progress/`` is emptied, its ``fingerprint.json`` last, then removed;
3. an old ``DST`` (``--overwrite``) is renamed ``DST.old-<pid>``, ``DST.partial`` renamed ``DST``;
4. ``DST.old-<pid>`` is deleted, then ``DST.partial.lock``.

Before 1, a ``DST.partial`` killed before its first checkpoint (nothing in it but
``_progress/`` with the fingerprint or its temp file: :func:`packer.write.resume.unstarted`) holds
nothing worth keeping: a plain run and ``--resume`` start it afresh (still refused while a live
writer holds ``DST.partial.lock``). After 1, ``DST.partial`` is *complete-but-unpublished*: ``--resume`` or a plain rerun with the
same options publishes it. After 3, ``--resume`` answers "complete". Leftovers of a dead
writer (its ``.partial.lock``, a ``DST.old-<pid>``) are removed by the next run that takes
the lock; nothing is left for the user to delete.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

from packer.core.manifest import MANIFEST_NAME, fsync_dir
from packer.errors import DestinationError
from packer.write.resume import unstarted

__all__ = [
    "DestinationLock",
    "check_destination",
    "check_reach",
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
            if os.path.islink(full):
                os.unlink(full)
            else:
                os.rmdir(full)
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


def _link_on_the_way(src: Path, folder: str) -> tuple[str, str]:
    """The first symlink on the path from ``src`` down to ``folder``, and where it points."""
    here = src
    for part in Path(os.path.relpath(folder, src)).parts:
        here = here / part
        if here.is_symlink():
            return str(here), os.path.realpath(here)
    return str(src), os.path.realpath(src)


def check_reach(src: Path, folders: Iterable[str], dst: Path) -> None:
    """Refuse a destination the scan reaches through a followed symlink: ``DST`` (or its
    ``.partial``) is, contains or is inside a folder ``folders`` (where the scan found
    samples) resolves to. Its files would be packed as data, then deleted by ``--overwrite``."""
    places = [Path(os.path.realpath(p)) for p in (dst, partial_path(dst))]
    for folder in folders:
        real = Path(os.path.realpath(folder))
        for place in places:
            if real == place or place in real.parents or real in place.parents:
                link, target = _link_on_the_way(src, folder)
                raise DestinationError(
                    f"destination {str(dst)!r} is reached by the scan of {str(src)!r} through "
                    f"the symlink {link!r} -> {target!r}: its files would be read as data "
                    f"(and deleted by --overwrite); choose a destination outside {target!r}"
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
    dst: Path,
    overwrite: bool,
    src: Path | None = None,
    resume: bool = False,
    published_ok: bool = False,
) -> None:
    """Refuse a destination that would harm the source, that a live process is writing (naming
    it), that exists (without ``overwrite``, and then only if packer wrote it), whose
    interrupted conversion would be silently discarded, or that cannot be created.

    ``resume`` lets an existing ``DST.partial`` through. A complete output (``DST`` with
    ``published_ok`` and no ``DST.partial``, or a complete ``DST.partial``) passes: whether it is
    the same conversion is decided once the lock is held (:mod:`packer.write.finish`)."""
    if src is not None:
        _check_apart(src, dst)
    holder = lock_holder(dst)
    if holder is not None:
        raise busy_error(dst, holder)
    _sweep(dst)
    try:
        _check_existing(dst, overwrite, resume, published_ok)
    except DestinationError:
        holder = lock_holder(dst)  # a writer that started meanwhile explains what was seen
        if holder is not None:
            raise busy_error(dst, holder) from None
        raise


def _check_existing(dst: Path, overwrite: bool, resume: bool, published_ok: bool) -> None:
    partial = partial_path(dst)
    has_partial = partial.exists() or partial.is_symlink()
    if dst.exists() or dst.is_symlink():
        if not overwrite and not (published_ok and not has_partial and is_packer_output(dst)):
            raise DestinationError(
                f"destination {str(dst)!r} exists; pass --overwrite to replace it"
            )
        if overwrite:
            _check_replaceable(dst, "destination")
    if has_partial and not resume and not unstarted(partial):  # unstarted: started afresh
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
        try:
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: the lock holds without the holder's pid; the
            if exc.errno != errno.ENOSPC:  # conversion's own check then says what is needed
                os.close(fd)
                raise DestinationError(f"cannot write {str(self.path)!r}: {exc}") from exc
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
