"""A local dataset read through the node's shard cache (local staging): ``file://`` URLs.

A dataset on a slow disk (an HDD, NFS) opened with ``cache_dir=`` (or ``cache=True``,
``cache_limit=``) is read as a dataset at the URL ``file:///its/real/path``: the remote open
path (``packer.remote.opener``) fetches its tables whole, and its shards are copied into the
shard cache as they are first read, by the same cached readers (``packer.remote.cached_reader``,
``packer.remote.cached_lmdb``), so a copy is checked against the manifest's xxh3 before it is
renamed into the cache, shared by every process of the node, bounded by ``cache_limit`` and
read ahead for readers in order, exactly as for a URL. Its "download" is a read of the local
file: :class:`LocalFiles` gives :class:`packer.remote.storage.RemoteFolder` the few calls of an
fsspec file system it makes, by ``pread`` on descriptors opened inside the dataset folder (no
link followed, regular files only: :func:`packer.core.contained.open_beneath`), so no fsspec is
needed. A ``file://`` URL without any cache option is the plain local path.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from packer.core.contained import open_beneath, open_folder
from packer.core.manifest import MANIFEST_NAME
from packer.errors import FormatError, PackerError
from packer.remote.failures import MissingObject, Passing

__all__ = ["LocalFiles", "file_path", "is_file_url", "staged_root"]

_PASSING_ERRNO = {errno.EIO, errno.ETIMEDOUT, errno.EAGAIN, errno.EINTR, errno.ESTALE}


def is_file_url(path: object) -> bool:
    """Whether ``path`` is a ``file:`` URL."""
    return isinstance(path, str) and path.startswith("file:")


def file_path(url: str) -> str:
    """The local path a ``file:`` URL names (``file:///data/x.lmdb``, ``file:/data/x.lmdb``,
    ``file://localhost/data/x.lmdb``; percent-escapes decoded).

    Raises:
        PackerError: a URL naming another host, or no absolute path.
    """
    rest = url[len("file:") :]
    if rest.startswith("//"):
        host, slash, path = rest[2:].partition("/")
        if host not in ("", "localhost"):
            raise PackerError(
                f"{url!r} names the host {host!r}: a file:// URL reads this machine's files "
                "only (file:///path, three slashes)"
            )
        rest = slash + path
    path = unquote(rest)
    if not path.startswith("/"):
        raise PackerError(f"{url!r} names no absolute path: write it as file:///absolute/path")
    return path


def staged_root(root: Any, cache_given: bool) -> Any:
    """What ``open_packed`` opens for ``root``: a ``file:`` URL's local path; a local dataset
    read through the shard cache (``cache_given``: a cache option other than ``cache=False``)
    as the ``file://`` URL of its real path; anything else as it is.

    Raises:
        PackerError: a local dataset to stage that is not there (no folder, no manifest).
    """
    if is_file_url(root):
        root = file_path(root)
    if not cache_given or (isinstance(root, str) and "://" in root):
        return root
    path = Path(os.path.realpath(os.fspath(root)))
    if not (path / MANIFEST_NAME).is_file():
        what = "does not exist" if not path.exists() else f"holds no {MANIFEST_NAME}"
        raise PackerError(
            f"{str(root)!r} {what}: only a packed dataset (a folder with {MANIFEST_NAME}) is "
            "read through the shard cache (cache_dir=, cache=True, cache_limit=)"
        )
    return "file://" + str(path)


class LocalFiles:
    """The calls :class:`packer.remote.storage.RemoteFolder` makes of an fsspec file system, for
    ``file://`` URLs: whole files, byte ranges, sizes, a listing. Holds nothing open between
    calls (picklable, fork-safe). A missing file is a
    :class:`packer.remote.failures.MissingObject`, a transient ``EIO``/``ESTALE`` (NFS) a
    :class:`packer.remote.failures.Passing` (tried again), any other failure a PackerError
    naming the path."""

    @staticmethod
    def _strip_protocol(url: str) -> str:
        return file_path(url) if is_file_url(url) else url

    def invalidate_cache(self, url: str | None = None) -> None:
        """Nothing is cached here (a listing is read anew each time)."""

    def _open(self, url: str) -> int:
        path = Path(self._strip_protocol(url))
        try:
            folder = open_folder(path.parent)
            try:
                return open_beneath(folder, path.name, path.parent, what="file name")
            finally:
                os.close(folder)
        except FormatError as exc:
            raise _local_error(str(path), exc.__cause__, exc) from exc

    def _read(self, fd: int, url: str, start: int, stop: int) -> bytes:
        """Bytes ``start:stop`` of ``fd`` (fewer only at the end of the file)."""
        parts, at = [], start
        try:
            while at < stop:
                block = os.pread(fd, min(stop - at, 16 << 20), at)
                if not block:
                    break
                parts.append(block)
                at += len(block)
        except OSError as exc:
            raise _local_error(self._strip_protocol(url), exc, None) from exc
        return b"".join(parts)

    def cat_file(
        self, url: str, start: int | None = None, end: int | None = None, **_: Any
    ) -> bytes:
        fd = self._open(url)
        try:
            stop = os.fstat(fd).st_size if end is None else end
            return self._read(fd, url, start or 0, stop)
        finally:
            os.close(fd)

    def cat(self, urls: list[str], **_: Any) -> dict[str, bytes]:
        """Each whole file (a failure raised: ``on_error="raise"``)."""
        return {url: self.cat_file(url) for url in urls}

    def cat_ranges(
        self,
        urls: list[str],
        starts: list[int],
        stops: list[int],
        on_error: str = "return",
        **_: Any,
    ) -> list[Any]:
        """Each range's bytes, or (``on_error="return"``) its exception; each file opened once."""
        opened: dict[str, int | BaseException] = {}
        out: list[Any] = []
        try:
            for url, a, b in zip(urls, starts, stops):
                try:
                    if url not in opened:
                        try:
                            opened[url] = self._open(url)
                        except PackerError as exc:
                            opened[url] = exc
                    fd = opened[url]
                    if isinstance(fd, BaseException):
                        raise fd
                    out.append(self._read(fd, url, a, b))
                except Exception as exc:
                    if on_error != "return":
                        raise
                    out.append(exc)
        finally:
            for fd in opened.values():
                if isinstance(fd, int):
                    os.close(fd)
        return out

    def info(self, url: str, **_: Any) -> dict[str, Any]:
        fd = self._open(url)
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        return {"name": self._strip_protocol(url), "size": size, "type": "file"}

    def ls(self, url: str, detail: bool = True, **_: Any) -> list[Any]:
        """The regular files of the folder ``url`` (links and other kinds left out)."""
        path = self._strip_protocol(url)
        try:
            with os.scandir(path) as entries:
                found = [
                    {"name": e.path, "size": e.stat(follow_symlinks=False).st_size, "type": "file"}
                    for e in entries
                    if e.is_file(follow_symlinks=False)
                ]
        except OSError as exc:
            raise _local_error(path, exc, None) from exc
        return found if detail else [e["name"] for e in found]


def _local_error(path: str, cause: BaseException | None, refused: Exception | None) -> Exception:
    """The error of a failed local read: missing, passing (tried again) or final."""
    if isinstance(cause, FileNotFoundError):
        return MissingObject(
            f"cannot read {path!r}: it is not there (the dataset was moved or removed since it "
            "was opened?); open the dataset again from where it is",
            denied=False,
        )
    if isinstance(cause, OSError) and cause.errno in _PASSING_ERRNO:
        return Passing(f"{path!r}: {cause.strerror or cause}")
    if refused is not None:
        return refused
    what = cause.strerror if isinstance(cause, OSError) and cause.strerror else cause
    return PackerError(f"cannot read {path!r}: {what}")
