"""Open a path inside a dataset folder, never outside it: the one place that resolves names.

Every file a reader, a table loader or ``verify`` opens inside a dataset — split folders, class
folders, per-sample files, tables, shards — is opened here, relative to the dataset folder's
descriptor, with no symbolic link at any level and never a FIFO, device or socket:

- a name must be a plain relative path (:func:`check_relative`): no absolute path, no empty,
  ``.`` or ``..`` component, no NUL byte;
- on Linux 5.6+ the open is one ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`` call (the
  kernel refuses a link anywhere in the path, and any escape); elsewhere each component is
  opened in turn with ``O_NOFOLLOW`` (``O_DIRECTORY`` for folders) relative to the previous one;
- files open with ``O_NONBLOCK`` (a FIFO never blocks the open) and must be regular files
  (``fstat``) before a byte is read; the descriptor is then made blocking again.

The same number of system calls as a plain ``openat``: a reader opens each file once per
process, as before. Imports nothing of packer but ``errors``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path
from urllib.parse import unquote

from packer.errors import FormatError

__all__ = [
    "Identity",
    "check_relative",
    "check_url_name",
    "fstat_identity",
    "open_beneath",
    "open_folder",
    "replaced",
]

Identity = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns

_SYS_OPENAT2 = 437  # the same number on every Linux architecture (a syscall added in 5.6)
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_REFUSED = (errno.ELOOP, errno.EXDEV, errno.ENOTDIR)  # a link, an escape, a non-folder
_FILE = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0)
_FOLDER = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECTORY


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_openat2: list[object] = []  # [syscall function] once probed and usable, [None] if not


def _syscall() -> object:
    if not _openat2:
        fn = None
        if os.uname().sysname == "Linux":
            try:
                fn = ctypes.CDLL(None, use_errno=True).syscall
                fn.restype = ctypes.c_long
            except (OSError, AttributeError):
                fn = None
        _openat2.append(fn)
    return _openat2[0]


def _open_kernel(dir_fd: int, name: str, flags: int) -> int | None:
    """``openat2`` beneath ``dir_fd`` with no link anywhere; None where the kernel lacks it."""
    fn = _syscall()
    if fn is None:
        return None
    how = _OpenHow(flags, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = fn(  # type: ignore[operator]
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(name)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd >= 0:
        return int(fd)
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EPERM):  # never "a link was found": ELOOP / EXDEV say that
        _openat2[0] = None  # not in this kernel, or filtered (seccomp): walk instead
        return None
    raise OSError(code, os.strerror(code))


def _open_walk(dir_fd: int, name: str, flags: int) -> int:
    """Each component in turn, relative to the previous one, with ``O_NOFOLLOW``."""
    parts = name.split("/")
    current = dir_fd
    try:
        for part in parts[:-1]:
            step = os.open(part, _FOLDER, dir_fd=current)
            if current != dir_fd:
                os.close(current)
            current = step
        return os.open(parts[-1], flags, dir_fd=current)
    finally:
        if current != dir_fd:
            os.close(current)


_PLAIN_PARTS = frozenset(("", ".", ".."))  # components a plain relative name never has


def check_relative(name: str, what: str = "name") -> str:
    """``name`` if it is a plain relative path: no absolute path, no empty, ``.`` or ``..``
    component, no NUL byte.

    Raises:
        FormatError: saying which name and why it is refused.
    """
    if not isinstance(name, str) or not name:
        raise FormatError(
            f"{what} {name!r} is empty or not a string; expected a plain relative name"
        )
    bad = "\0" in name or name[0] == "/" or not _PLAIN_PARTS.isdisjoint(name.split("/"))
    if bad:
        raise FormatError(
            f"{what} {name!r} is not a plain relative name (absolute, '..', '.', an empty "
            "component or a NUL byte); refusing to read outside the dataset folder"
        )
    return name


def check_url_name(name: str, url: str) -> str:
    """``name`` if it is a plain relative name in the folder at ``url``, also once
    percent-decoded (an HTTP client turns ``%2e%2e`` into ``..`` and resolves it; some servers
    read a backslash as a slash): checked before any request leaves for the store.

    Raises:
        FormatError: a name that would reach outside the folder.
    """
    decoded, before = check_relative(name, f"name in {url!r}:"), None
    while decoded != before:
        before, decoded = decoded, unquote(decoded)
    if url.startswith(("http://", "https://")):
        decoded = decoded.replace("\\", "/")
    if decoded != name:
        check_relative(decoded, f"name in {url!r}: {name!r}, decoded as")
    return name


def _why(dir_fd: int, name: str) -> str:
    """Which component of ``name`` is a link or not a folder (an error path only)."""
    parts = name.split("/")
    for k in range(len(parts)):
        sub = "/".join(parts[: k + 1])
        try:
            st = os.stat(sub, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return f"{sub!r} cannot be reached"
        if stat.S_ISLNK(st.st_mode):
            return f"{sub!r} is a symbolic link"
        if k < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            return f"{sub!r} is not a folder"
    return f"{name!r} is not a folder"


def open_beneath(
    dir_fd: int, name: str, where: Path | str, folder: bool = False, what: str = "name"
) -> int:
    """A descriptor of ``name`` under the folder ``dir_fd`` (shown as ``where`` in errors): a
    regular file, or with ``folder`` a folder; no symbolic link at any level, never a FIFO.

    Raises:
        FormatError: ``name`` not plain, missing, a link anywhere, or not a regular file.
    """
    check_relative(name, what)
    flags = _FOLDER if folder else _FILE
    try:
        fd = _open_kernel(dir_fd, name, flags)
        if fd is None:
            fd = _open_walk(dir_fd, name, flags)
    except OSError as exc:
        path = Path(where) / name  # built for the message only: not on the way of every open
        if exc.errno in _REFUSED:
            raise FormatError(
                f"cannot open {str(path)!r}: {_why(dir_fd, name)} inside the dataset; refusing to "
                "follow it (a dataset holds only plain folders and files). Convert again"
            ) from exc
        raise FormatError(f"cannot open {str(path)!r}: {exc.strerror or exc}") from exc
    st = os.fstat(fd)
    kind = stat.S_ISDIR(st.st_mode) if folder else stat.S_ISREG(st.st_mode)
    if not kind:
        os.close(fd)
        path = Path(where) / name
        expected = "a folder" if folder else "a regular file (a FIFO, device or socket?)"
        raise FormatError(f"{str(path)!r} is not {expected}; refusing to read it")
    if not folder:
        os.set_blocking(fd, True)
    return fd


def fstat_identity(fd: int) -> Identity:
    """What identifies an open file's content: device, inode, size, modification time."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def replaced(path: Path | str) -> FormatError:
    """The error for a file or folder that is no longer the one the dataset was opened with."""
    return FormatError(
        f"{str(path)!r} was replaced after the dataset was opened (converted again with "
        "--overwrite?); open the dataset again"
    )


def open_folder(path: Path | str, expected: tuple[int, int] | None = None) -> int:
    """A descriptor of the dataset folder ``path`` (the user's path: links in it are theirs);
    with ``expected``, the very folder ``(st_dev, st_ino)`` seen when the dataset was opened.

    Raises:
        FormatError: the folder cannot be opened, or it was replaced.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise FormatError(f"cannot open {str(path)!r}: {exc.strerror or exc}") from exc
    st = os.fstat(fd)
    if expected is not None and (st.st_dev, st.st_ino) != tuple(expected):
        os.close(fd)
        raise replaced(path)
    return fd
