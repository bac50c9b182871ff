"""Where a dataset's bytes come from: a URL (``s3://``, ``http(s)://``, any fsspec protocol),
read as whole small objects (manifest, tables, keys) and as byte ranges of data files (a local
folder never comes here, but as a ``file://`` URL when it is staged through the shard cache:
``packer.remote.local``). ``fsspec`` (the ``remote`` extra) is imported on first use only.
Every attempt is bounded in time (:data:`packer.core.sizes.BOUNDS`), every name checked first.

One rule for processes: a :class:`RemoteFolder` pickles as its URL and storage options; each
process builds its own fsspec file system on first use, keyed by ``os.getpid()``. A forked
DataLoader worker therefore never touches its parent's client (fsspec's async clients are not
fork-safe: fsspec/filesystem_spec#835; fsspec resets its event loop after a fork and the
instance is built with ``skip_instance_cache``, so no parent session is reused).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any, TypeVar

from packer.core.contained import check_url_name
from packer.core.retry import Retry, retried
from packer.core.sizes import WHOLE, bounds, deadline, read_advice
from packer.errors import FormatError, PackerError
from packer.formats.files import coalesce
from packer.remote.downloads import background, cancel_downloads, cancelled
from packer.remote.failures import (
    MissingObject,
    Passing,
    failure,
    http_status,
    passing,
    remote_error,
)
from packer.remote.local import LocalFiles
from packer.remote.obstore_backend import POOL, fsspec_options
from packer.remote.watchdog import watched_options

__all__ = ["GAP", "POOL", "RETRY", "RemoteFolder", "Retry", "coalesce", "failure", "is_url"]
__all__ += ["MissingObject", "Passing", "http_status", "join_url", "passing", "remote_error"]

T = TypeVar("T")

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_CHUNK = 8 << 20  # a streamed checksum or a download reads this much per request
_IN_FLIGHT = 4  # a download's requests in flight at once
GAP = 64 << 10  # two records closer than this are fetched by one ranged GET (a request costs more)


def is_url(path: object) -> bool:
    """Whether ``path`` is a URL (``scheme://...``) rather than a local path."""
    return (
        isinstance(path, str) and _SCHEME.match(path) is not None and not path.startswith("file:")
    )


def join_url(url: str, name: str) -> str:
    """``url/name`` (``name`` a plain relative path already checked)."""
    return url.rstrip("/") + "/" + name


def _import_fsspec() -> Any:
    try:
        import fsspec
    except ImportError as exc:
        raise PackerError(
            "reading a dataset from a URL needs fsspec (and s3fs for s3://): "
            'pip install "packer-datasets[remote]"'
        ) from exc
    return fsspec


RETRY = Retry()  # read at each request: a process may set packer.remote.storage.RETRY = Retry(...)


class RemoteFolder:
    """A dataset folder at ``url``, read through fsspec (its ranged GETs through obstore where
    chosen: :meth:`ranges`); picklable (URL and options only).

    Args:
        url: the folder's URL (``s3://bucket/out.npy``).
        storage_options: for the fsspec file system (``endpoint_url``, ``anon``, ...), and
            ``backend`` (``"obstore"`` or ``"fsspec"``: :mod:`packer.remote.obstore_backend`).
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.options = dict(storage_options or {})
        self.identity: dict[str, tuple[int, str | None]] = {}  # name: (size, ETag) at open
        self._fs: Any = None
        self._pid = -1
        self._ranged: tuple[int, Any] = (-1, None)  # (pid, obstore's reader or None)
        self.bounds = bounds(self.options)  # checked at once: a bad value is no network error

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "options": self.options, "identity": self.identity}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["options"])  # type: ignore[misc]
        self.identity = dict(state.get("identity", {}))

    def call(self, url: str, request: Callable[[], T]) -> T:
        """``request()``, tried again after a passing failure (:func:`passing`) as
        :data:`RETRY` says; any other failure at once.

        Raises:
            PackerError: naming ``url`` and the attempts made (FormatError: missing, denied,
                replaced or truncated).
        """

        def retry_on(exc: Exception) -> bool:
            if not passing(exc):
                raise remote_error(url, exc) from exc
            _stop_if_cancelled(url)
            self.check_unchanged(url)
            return True

        def give_up(exc: Exception, attempts: int, spent: float) -> PackerError:
            return PackerError(
                f"cannot read {url!r}: {attempts} attempts over {spent:.1f}s all failed, the "
                f"last with {failure(exc)}. {read_advice(self.bounds, exc)}"
            )

        try:
            return retried(RETRY, lambda _: request(), retry_on, give_up)
        except PackerError:
            if not background():
                cancel_downloads()  # a read failed: its error must not wait for prefetches
            raise

    def limit(self, nbytes: int | None = None, fs: Any = None) -> dict[str, float]:
        """``timeout=`` for a call moving ``nbytes`` through an async file system (``fs``, else
        :meth:`fs`), which cancels it past :func:`packer.core.sizes.deadline`; none for another."""
        bound = {"timeout": deadline(self.bounds, nbytes)}
        return bound if getattr(fs or self.fs(), "async_impl", False) else {}

    def check_unchanged(self, url: str) -> None:
        """After a failed read of an object recorded at open: refuse it if replaced since."""
        name = self._name(url)
        if name not in self.identity:
            return
        try:
            self.fs().invalidate_cache(url)  # the listing at open is cached: ask the store
            found = _identity(self.fs().info(url, **self.limit(0)))
        except Exception:
            return  # unreachable now: the retry decides
        size, etag = self.identity[name]
        if found[0] != size or (etag and found[1] and found[1] != etag):
            raise FormatError(
                f"{url!r} was replaced after the dataset was opened: it has {found[0]} bytes "
                f"(ETag {found[1]}) but had {size} bytes (ETag {etag}). Its records would mix "
                "two uploads; open the dataset again"
            )

    def fs(self) -> Any:
        """This process's file system (built on first use, again after a fork)."""
        if self._fs is None or self._pid != os.getpid():
            protocol = self.url.split("://", 1)[0]
            if protocol == "file":  # a local dataset staged through the cache: no fsspec
                self._fs, self._pid = LocalFiles(), os.getpid()
                return self._fs
            fsspec = _import_fsspec()
            try:
                options = fsspec_options(protocol, self.options)
                options = watched_options(protocol, options, self.bounds)
                self._fs = fsspec.filesystem(protocol, skip_instance_cache=True, **options)
            except PackerError:  # it names the option and the way out
                raise
            except Exception as exc:  # unknown protocol, a backend not installed, bad options
                raise PackerError(
                    f"cannot open {self.url!r}: {type(exc).__name__}: {exc}. For s3:// install "
                    's3fs (pip install "packer-datasets[remote]"); check storage_options'
                ) from exc
            if protocol in ("s3", "s3a") and "retries" not in self.options:
                self._fs.retries = 1  # s3fs's own loop: packer's RETRY is the one retry layer
            self._pid = os.getpid()
        return self._fs

    def ranges(self) -> Any:
        """What serves this process's ranged GETs (``cat_ranges``): obstore when chosen and
        safe here (:mod:`packer.remote.obstore_backend`), else :meth:`fs`."""
        if self._ranged[0] != os.getpid():
            from packer.remote import obstore_backend as ob

            local = self.url.startswith("file:")
            use = not local and ob.usable() and ob.backend_of(self.options, self.url) == "obstore"
            self._ranged = (os.getpid(), ob.ObstoreRanges(self.options) if use else None)
        return self._ranged[1] or self.fs()

    def _name(self, url: str) -> str:
        return url[len(self.url) + 1 :] if url.startswith(self.url + "/") else ""

    def url_of(self, name: str) -> str:
        """The URL of ``name`` here, checked before any request (``check_url_name``)."""
        return join_url(self.url, check_url_name(name, self.url))

    def read_whole(self, name: str, **more: Any) -> bytes:
        """The whole object ``name`` (a manifest, a table, ``keys.txt``)."""
        url = self.url_of(name)
        size = self.identity.get(name, (None,))[0]
        return bytes(self.call(url, lambda: self.fs().cat_file(url, **more, **self.limit(size))))

    def read_wholes(self, names: list[str]) -> list[bytes]:
        """The whole objects ``names``, the requests in flight together (the tables at open)."""
        urls = [self.url_of(n) for n in names]
        size = sum(self.identity.get(n, (WHOLE,))[0] for n in names)
        found = self.call(
            self.url, lambda: self.fs().cat(urls, on_error="raise", **self.limit(size))
        )
        strip = self.fs()._strip_protocol  # the answer's keys: paths without the scheme
        return [bytes(found[u] if u in found else found[strip(u)]) for u in urls]

    def stream_checksum(self, name: str) -> tuple[int, str]:
        """The size and xxh3_64 hex digest of the whole object ``name``, read by ranged GETs of
        :data:`_CHUNK`, each bounded in time; a failed stream starts again (:meth:`call`)."""
        url = self.url_of(name)

        def stream() -> tuple[int, str]:
            import xxhash

            fs, digest = self.fs(), xxhash.xxh3_64()
            size = int(fs.info(url, **self.limit(0)).get("size") or 0)
            for a, b in ((a, min(a + _CHUNK, size)) for a in range(0, size, _CHUNK)):
                block = fs.cat_file(url, start=a, end=b, **self.limit(b - a))
                if len(block) != b - a:
                    raise Passing(f"{url!r} gave {len(block)} of {b - a} bytes from {a}")
                digest.update(block)
            return size, digest.hexdigest()

        return self.call(url, stream)

    def download(self, name: str, fd: int, size: int) -> str:
        """Write the first ``size`` bytes of object ``name`` into the file ``fd`` (from its
        start, truncated first) by ranged GETs of :data:`_CHUNK`, :data:`_IN_FLIGHT` at once,
        each retried on its own (:meth:`read_runs`), always through fsspec whatever serves the
        ranged record reads: its sockets are watched (:mod:`packer.remote.watchdog`), so a
        trickle is cut at ``read_timeout`` (obstore's are bounded per attempt only, by
        ``bytes / min_rate``: minutes for a chunk); return the xxh3_64 hex digest of the bytes
        written."""
        import xxhash

        digest = xxhash.xxh3_64()
        os.ftruncate(fd, 0)
        done = 0
        while done < size:
            _stop_if_cancelled(self.url_of(name))
            starts = list(range(done, min(size, done + _CHUNK * _IN_FLIGHT), _CHUNK))
            stops = [min(a + _CHUNK, size) for a in starts]
            runs = self.read_runs([name] * len(starts), starts, stops, via=self.fs())
            for start, block in zip(starts, runs):
                digest.update(block)
                view = memoryview(block)
                while view:
                    view = view[os.pwrite(fd, view, start + len(block) - len(view)) :]
            done = stops[-1]
        return digest.hexdigest()

    def sizes(self, names: list[str]) -> dict[str, int]:
        """The size of each object ``names`` that exists: one listing, or one HEAD each (HTTP)."""
        fs = self.fs()
        if self.url.split("://", 1)[0] in ("http", "https"):
            urls = [self.url_of(n) for n in names]
            sizes = self.call(self.url, lambda: fs.sizes(urls, **self.limit(0)))
            self.identity.update((n, (int(b), None)) for n, b in zip(names, sizes))
            return dict(zip(names, (int(n) for n in sizes)))
        entries = self.call(self.url, lambda: fs.ls(self.url, detail=True, **self.limit()))
        found = {str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: _identity(e) for e in entries}
        self.identity.update((n, found[n]) for n in names if n in found)
        return {name: found[name][0] for name in names if name in found}

    def read_runs(
        self, names: list[str], starts: list[int], stops: list[int], via: Any = None
    ) -> list[bytes]:
        """``names[k]``'s bytes ``starts[k]:stops[k]`` for every ``k``, the requests in flight
        together (one ranged GET each), through ``via`` (else :meth:`ranges`).

        Raises:
            FormatError: an object ends before a range does (truncated or replaced).
        """
        urls = [self.url_of(n) for n in names]
        got: list[bytes | None] = [None] * len(urls)

        def attempt() -> list[bytes]:  # only the ranges not yet read are asked again
            todo = [k for k, block in enumerate(got) if block is None]
            size, ranges = sum(stops[k] - starts[k] for k in todo), via or self.ranges()
            blocks = ranges.cat_ranges(
                [urls[k] for k in todo],
                [starts[k] for k in todo],
                [stops[k] for k in todo],
                on_error="return",
                **self.limit(size, ranges),
            )
            failed: Exception | None = None
            for k, block in zip(todo, blocks):
                try:
                    got[k] = self._checked(urls[k], starts[k], stops[k], block)
                except Exception as exc:
                    failed = failed if failed is not None and passing(exc) else exc
            if failed is not None:
                raise failed
            return [block for block in got if block is not None]

        return self.call(urls[0] if len(set(urls)) == 1 else self.url, attempt)

    def _checked(self, url: str, a: int, b: int, block: Any) -> bytes:
        """``block``, the answer to the range ``a:b`` of ``url``, if it is whole."""
        if isinstance(block, BaseException):
            if passing(block):
                raise Passing(f"{url!r}: {type(block).__name__}: {block}") from block
            raise remote_error(url, block)
        if len(block) == b - a:
            return bytes(block)
        if len(block) > b - a:  # a 200 with the whole object: a Range ignored (a proxy, a server)
            raise Passing(f"{url!r} answered {len(block)} bytes to a Range request of {b - a}")
        self.check_unchanged(url)
        if self._name(url) in self.identity or self._size_now(url) >= b:  # a cut body
            raise Passing(f"{url!r} gave {len(block)} of {b - a} bytes from {a} (cut short)")
        raise FormatError(
            f"{url!r} ends before byte {b} (it gave {len(block)} of {b - a} bytes from "
            f"{a}): the object is truncated or was replaced after the dataset was "
            "converted; convert and upload it again"
        )

    def _size_now(self, url: str) -> int:
        """The object's size as the store says now (-1 when it cannot say)."""
        try:
            self.fs().invalidate_cache(url)
            return int(self.fs().info(url, **self.limit(0)).get("size") or 0)
        except Exception:
            return -1


def _stop_if_cancelled(url: str) -> None:
    """A background download cancelled (the process exits, a read failed) stops here."""
    if cancelled():
        raise PackerError(f"the background download of {url!r} was cancelled")


def _identity(entry: dict[str, Any]) -> tuple[int, str | None]:
    """An object's size and ETag (or version) from a listing or ``info()`` entry."""
    tag = entry.get("ETag") or entry.get("VersionId") or entry.get("etag")
    return int(entry.get("size") or 0), (str(tag) if tag else None)
