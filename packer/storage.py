"""Where a dataset's bytes come from: a URL (``s3://``, ``http(s)://``, any fsspec protocol),
read as whole small objects (manifest, tables, keys) and as byte ranges of data files.

A local folder never comes here: its readers keep their own descriptors and maps
(``packer.formats.files``), so the local path gains no call. ``fsspec`` (the ``remote`` extra)
is imported on first use only.

One rule for processes: a :class:`RemoteFolder` pickles as its URL and storage options; each
process builds its own fsspec file system on first use, keyed by ``os.getpid()``. A forked
DataLoader worker therefore never touches its parent's client (fsspec's async clients are not
fork-safe: fsspec/filesystem_spec#835; fsspec resets its event loop after a fork and the
instance is built with ``skip_instance_cache``, so no parent session is reused).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import Any

from packer.errors import FormatError, PackerError

__all__ = ["GAP", "RemoteFolder", "coalesce", "is_url", "join_url"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
GAP = 64 << 10  # two records closer than this are fetched by one ranged GET (a request costs more)


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return (
        isinstance(path, str) and _SCHEME.match(path) is not None and not path.startswith("file:")
    )


def join_url(url: str, name: str) -> str:
    """``url/name`` (``name`` a plain relative path already checked)."""
    return url.rstrip("/") + "/" + name


def coalesce(
    starts: Sequence[int], lengths: Sequence[int], gap: int = 4096
) -> list[tuple[int, int, int, int]]:
    """Group ranges sorted by start into runs read at once: ``(start, stop, first, last+1)``.

    Two ranges join a run when the bytes between them are fewer than ``gap`` (a local file: a
    page, read anyway; a URL: :data:`GAP`, cheaper than another request).
    """
    runs: list[tuple[int, int, int, int]] = []
    for k, (a, n) in enumerate(zip(starts, lengths)):
        if runs and a - runs[-1][1] < gap and a >= runs[-1][0]:
            start, stop, first, _ = runs[-1]
            runs[-1] = (start, max(stop, a + n), first, k + 1)
        else:
            runs.append((a, a + n, k, k + 1))
    return runs


def _import_fsspec() -> Any:
    try:
        import fsspec
    except ImportError as exc:
        raise PackerError(
            "reading a dataset from a URL needs fsspec (and s3fs for s3://): "
            'pip install "packer-datasets[remote]"'
        ) from exc
    return fsspec


def _missing(exc: BaseException) -> bool:
    if isinstance(exc, (FileNotFoundError, PermissionError)):
        return True
    text = str(exc)
    return any(code in text for code in ("404", "403", "NoSuchKey", "NoSuchBucket", "Forbidden"))


def remote_error(url: str, exc: BaseException) -> PackerError:
    """A packer error naming ``url`` for any exception of fsspec or its backend."""
    if isinstance(exc, PackerError):
        return exc
    what = f"{type(exc).__name__}: {exc}".strip()
    if "not satisfiable" in str(exc) or "InvalidRange" in str(exc):
        return FormatError(
            f"{url!r} is shorter than a record the dataset's tables place in it ({what}): the "
            "object is truncated or was replaced after the conversion; upload the output again"
        )
    if _missing(exc):
        return FormatError(
            f"cannot read {url!r}: the object is missing or access is denied ({what}). Check "
            "the URL, the credentials (AWS_ACCESS_KEY_ID, a profile, an instance role) and the "
            "endpoint (storage_options={'endpoint_url': ...})"
        )
    return PackerError(f"cannot read {url!r}: {what}. Check the network and the endpoint")


class RemoteFolder:
    """A dataset folder at ``url``, read through fsspec; picklable (URL and options only).

    Args:
        url: the folder's URL (``s3://bucket/out.npy``).
        storage_options: passed to the fsspec file system (``endpoint_url``, ``anon``, ...).
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.options = dict(storage_options or {})
        self._fs: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"])  # type: ignore[misc]

    def fs(self) -> Any:
        """This process's file system (built on first use, again after a fork)."""
        if self._fs is None or self._pid != os.getpid():
            fsspec = _import_fsspec()
            protocol = self.url.split("://", 1)[0]
            try:
                self._fs = fsspec.filesystem(protocol, skip_instance_cache=True, **self.options)
            except Exception as exc:  # unknown protocol, a backend not installed, bad options
                raise PackerError(
                    f"cannot open {self.url!r}: {type(exc).__name__}: {exc}. For s3:// install "
                    's3fs (pip install "packer-datasets[remote]"); check storage_options'
                ) from exc
            self._pid = os.getpid()
        return self._fs

    def url_of(self, name: str) -> str:
        """The URL of ``name`` in this folder."""
        return join_url(self.url, name)

    def read_whole(self, name: str) -> bytes:
        """The whole object ``name`` (a manifest, a table, ``keys.txt``)."""
        url = self.url_of(name)
        try:
            return bytes(self.fs().cat_file(url))
        except Exception as exc:
            raise remote_error(url, exc) from exc

    def sizes(self, names: list[str]) -> dict[str, int]:
        """The size of each object ``names`` that exists, by name: one listing of the folder,
        or over HTTP (no listing) one ``HEAD`` per object, all in flight together."""
        fs = self.fs()
        try:
            if self.url.split("://", 1)[0] in ("http", "https"):
                urls = [self.url_of(n) for n in names]
                return dict(zip(names, (int(n) for n in fs.sizes(urls))))
            entries = fs.ls(self.url, detail=True)
        except Exception as exc:
            raise remote_error(self.url, exc) from exc
        found = {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: e.get("size") for e in entries}
        return {name: int(found[name] or 0) for name in names if name in found}

    def read_runs(self, names: list[str], starts: list[int], stops: list[int]) -> list[bytes]:
        """``names[k]``'s bytes ``starts[k]:stops[k]`` for every ``k``, the requests in flight
        together (one ranged GET each).

        Raises:
            FormatError: an object ends before a range does (truncated or replaced).
        """
        urls = [self.url_of(n) for n in names]
        try:
            blocks = self.fs().cat_ranges(urls, starts, stops)
        except Exception as exc:
            raise remote_error(urls[0] if len(set(urls)) == 1 else self.url, exc) from exc
        for url, a, b, block in zip(urls, starts, stops, blocks):
            if isinstance(block, BaseException):
                raise remote_error(url, block)
            if len(block) != b - a:
                raise FormatError(
                    f"{url!r} ends before byte {b} (it gave {len(block)} of {b - a} bytes from "
                    f"{a}): the object is truncated or was replaced after the dataset was "
                    "converted; convert and upload it again"
                )
        return [bytes(b) for b in blocks]
