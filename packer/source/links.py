"""Links in a source: a file read through a link is read only when it stays inside the source.

A source with fields (key-grouped files, a table's image paths, COCO ``file_name``\\ s, a
folder of tars) may hold a symbolic link, to a file or a folder, whose target leaves the source
root (``0001.txt -> /etc/hostname``, ``../outside/secret.txt``, ``/proc/self/environ``): such a
file is not read unless the conversion is asked to follow links (``--follow-links``,
``follow_links=True``); its sample is skipped, the reason starting with :data:`OUTSIDE`.

The check is made on the opened descriptor, not on the path text, so a link swapped after the
scan cannot slip by: a file with no link on its way is opened beneath the root's descriptor by
:func:`packer.core.contained.open_beneath` (the kernel refuses any link); otherwise the path is
opened (links followed, ``O_NONBLOCK``: a FIFO never blocks) and the descriptor's own location
(``/proc/self/fd``; where that is missing, the resolved path whose file must be the very file
opened) must lie under the root's real location. Either way the file must be a regular file.
Imports nothing of packer but ``core.contained`` and ``errors``.
"""

from __future__ import annotations

import errno
import os
import stat

from packer.core.contained import fstat_identity, open_beneath
from packer.errors import FormatError, InputFileError

__all__ = [
    "OUTSIDE",
    "FOLLOW_HINT",
    "LOOP",
    "folder_entry",
    "loops_in",
    "open_source_fd",
    "read_source_file",
]

OUTSIDE = "a link leading outside the source"  # how every such skip reason starts
LOOP = "symlink loop (not followed)"
FOLLOW_HINT = "not followed (--follow-links follows it)"
_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
_ROOTS: dict[tuple[int, str], int] = {}  # (pid, root) -> the root's descriptor, per process


def _root_fd(root: str) -> int:
    key = (os.getpid(), root)
    fd = _ROOTS.get(key)
    if fd is None:
        fd = _ROOTS[key] = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    return fd


def _beneath(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip("/") + "/")


def _located(fd: int, path: str) -> str | None:
    """Where the open file ``fd`` really is: the kernel's name of it, or (no ``/proc``) the
    resolved ``path`` when that is the very file opened; None when it cannot be told."""
    try:
        where = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        where = ""
    if where.startswith("/") and not where.endswith(" (deleted)"):
        return where
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return None
    same = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == fstat_identity(fd)
    return real if same else None


def _plain(root: str, path: str) -> int | None:
    """A descriptor of ``path`` opened beneath ``root`` with no link on its way, or None when
    that open is refused (a link, a missing file, a FIFO: the careful path tells which)."""
    if not path.startswith(root):
        path = os.path.abspath(path)
    rel = path[len(root) + 1 :]
    if not path.startswith(root) or path[len(root) : len(root) + 1] != "/":
        return None
    try:
        return open_beneath(_root_fd(root), rel, root)  # checks that ``rel`` is plain
    except (FormatError, OSError):
        return None


def open_source_fd(root: str, path: str, follow_links: bool = False) -> int:
    """A blocking descriptor of the regular file ``path`` of the source whose real root is
    ``root`` (an absolute, resolved path: a scan's ``root``); the caller closes it. Unless
    ``follow_links``, the file must lie under ``root`` once opened (see the module docstring).

    Raises:
        InputFileError: the reason (starting with :data:`OUTSIDE` for a link leaving the
            source), for a file that cannot or must not be read.
    """
    fd = None if follow_links else _plain(root, path)
    if fd is None:
        try:
            fd = os.open(path, _FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InputFileError(LOOP) from exc
            raise InputFileError(f"cannot read: {exc.strerror or exc}") from exc
        try:
            _check_opened(fd, root, path, follow_links)
        except BaseException:
            os.close(fd)
            raise
    os.set_blocking(fd, True)
    return fd


def _check_opened(fd: int, root: str, path: str, follow_links: bool) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise InputFileError("not a regular file (a FIFO, socket or device?)")
    if follow_links:
        return
    where = _located(fd, path)
    if where is None or not _beneath(where, os.path.realpath(root)):
        raise InputFileError(f"{OUTSIDE} ({where or 'somewhere unknown'}): {FOLLOW_HINT}")


def read_source_file(
    root: str, path: str, follow_links: bool = False, max_bytes: int = 64_000_000
) -> bytes:
    """The bytes of the source file ``path`` (:func:`open_source_fd`'s checks), at most
    ``max_bytes``, checked before reading.

    Raises:
        InputFileError: the reason, for a file that cannot or must not be read.
    """
    fd = open_source_fd(root, path, follow_links)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise InputFileError(
                f"{size / 1e6:.1f} MB, over the {max_bytes / 1e6:.0f} MB limit (--max-file-size)"
            )
        chunks, got = [], 0
        while got <= size:  # one byte past the size: a file that grew shows it
            chunk = os.read(fd, size + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    except OSError as exc:
        raise InputFileError(f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return b"".join(chunks)


def folder_entry(entry: os.DirEntry[str]) -> bool | None:
    """Whether a listed entry is a folder (links followed): True, False, or None for a
    symbolic link loop (``loop -> loop``), which the scan skips and lists."""
    try:
        return entry.is_dir()
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        return False


def loops_in(folder: str | os.PathLike[str]) -> list[str]:
    """The paths of the entries of ``folder`` that are symlink loops (``loop -> loop``), for a
    scan to skip and list; [] when the folder cannot be listed (the scan says so)."""
    try:
        with os.scandir(folder) as it:
            return sorted(e.path for e in it if folder_entry(e) is None)
    except OSError:
        return []
