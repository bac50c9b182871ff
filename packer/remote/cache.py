"""The node-local shard cache: whole objects of remote datasets (shards) downloaded once per
node, shared by every process and DataLoader worker.

Coordinated through files and ``flock`` only — no shared memory, no daemon, nothing a crash
leaves blocking (a lock dies with its process). In ``cache_dir``, per object ``K`` (a hash of
its URL, size, ETag and the manifest's xxh3, so a re-uploaded object is a new entry):

- ``K.data``: the object, renamed into place only after its size and xxh3 were checked; a
  reader that finds a record of it differing from the record table's xxh3 has it replaced
  (:meth:`ShardCache.open` with ``bad=``): downloaded again and renamed over it, never written
  in place, so a process still mapping the old file reads it whole (and checks it too);
- ``K.lock``: every process reading ``K.data`` holds a shared lock on it; eviction takes it
  exclusively without waiting, so an object in use is never removed;
- ``K.part``: a download in progress, itself the download lock (exclusive): other processes
  wanting ``K`` wait on it, then use the finished file. A killed downloader's part is unlocked:
  the next process truncates and redoes it, or removes it (eviction, ``packer cache clear``);
- ``K.json``: what the object is (URL, size, ETag, xxh3), for ``packer cache ls``.

Eviction is least recently used (mtime touched at each open) under ``limit`` bytes; objects in use
are skipped, so the cache exceeds the limit by at most the objects being read (until their process
exits). A lock file may be unlinked only by a holder of its exclusive lock; whoever locks a file
checks that the path still names it, else locks the new one (:func:`packer.core.file_locks.lock`).
Every file is opened with no link followed and used only as a regular file of this user with one
link (:func:`packer.core.file_locks.open_own`): a ``K.data`` that is not is downloaded again and
renamed over; a link or foreign file as a lock or part is refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import multiprocessing.util
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.core.cpus import packer_home
from packer.core.file_locks import (
    CacheEntry,
    UnsafeCacheFile,
    finished,
    lock,
    own_file,
    release,
    release_at_exit,
    unlink_quietly,
    write_new,
)
from packer.core.sizes import format_size, parse_size
from packer.errors import PackerError
from packer.remote.download import CorruptDownload, download
from packer.remote.downloads import end_downloads, in_background
from packer.remote.downloads import wait_for_downloads as wait_for_downloads
from packer.remote.storage import RemoteFolder

__all__ = [
    "CacheEntry",
    "Cached",
    "CorruptDownload",
    "ShardCache",
    "default_cache_dir",
    "parse_limit",
    "wait_for_downloads",
]

_EVICT = ".evict.lock"  # held while one process makes room, so two do not both evict
_LIMITED: dict[tuple[int, str, int], ShardCache] = {}  # the limited caches used, by process


def _trim_at_exit() -> None:
    """At exit (a DataLoader worker's too), its downloads done, objects released: trim back."""
    end_downloads()  # downloads end first, unless a failed read cancelled them
    release_at_exit()
    for (pid, _, _), cache in list(_LIMITED.items()):
        if pid == os.getpid():
            with suppress(OSError, PackerError):
                cache._make_room(0)


def _trim_on_exit(cache: ShardCache) -> None:
    key = (os.getpid(), str(cache.dir), cache.limit or 0)
    if cache.limit is not None and key not in _LIMITED:
        if all(pid != key[0] for pid, _, _ in _LIMITED):  # a forked child's hooks start empty
            multiprocessing.util.Finalize(None, _trim_at_exit, exitpriority=0)
        _LIMITED[key] = cache


def default_cache_dir() -> Path:
    """``$PACKER_CACHE_DIR``, else ``$XDG_CACHE_HOME/packer``, else ``~/.cache/packer``."""
    return packer_home()


def parse_limit(limit: int | str | None) -> int | None:
    """``cache_limit`` as bytes (``"200GB"``, ``"500MiB"``, 10**9), or None for no limit."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, str)):
        raise PackerError(f"cache_limit must be bytes or a size such as '200GB', not {limit!r}")
    return parse_size(limit)


@dataclass(frozen=True)
class Cached:
    """An object found in the cache (``packer cache ls``)."""

    key: str
    url: str
    bytes: int
    used: float  # last use (mtime, seconds since the epoch)
    in_use: bool  # a process holds it (reading, or downloading when ``partial``)
    partial: bool = False


class ShardCache:
    """Whole objects of remote datasets in the folder ``cache_dir`` (created on first use).

    Picklable as its folder and limit; every process coordinates through the files.

    Args:
        cache_dir: the folder (default: :func:`default_cache_dir`); a node-local file system
            (``flock`` is not reliable over NFS).
        limit: the most bytes kept (``"200GB"``, an int), None for no limit.
    """

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None, limit: Any = None):
        self.dir = Path(cache_dir or default_cache_dir()).expanduser().absolute()
        self.limit = parse_limit(limit)

    def __repr__(self) -> str:
        return f"ShardCache({str(self.dir)!r}, {format_size(self.limit) if self.limit else 'no limit'})"

    def check_fits(self, size: int, where: str) -> None:
        """Refuse an object larger than the limit (at open: before any download)."""
        if self.limit is not None and size > self.limit:
            raise PackerError(
                f"cache_limit={self.limit} bytes ({format_size(self.limit)}) is smaller than "
                f"{where} ({size} bytes, {format_size(size)}): the cache must hold at least one "
                f"whole shard. Raise cache_limit to at least {size} (better: several shards)"
            )

    def _path(self, key: str, suffix: str) -> Path:
        return self.dir / (key + suffix)

    @staticmethod
    def key(url: str, size: int, etag: str | None, xxh3: str) -> str:
        """The entry of an object: changes with its URL, size, ETag or checksum."""
        text = "\0".join((url, str(size), etag or "", xxh3))
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def _entry_key(self, folder: RemoteFolder, name: str, size: int, xxh3: str) -> str:
        etag = folder.identity.get(name, (size, None))[1]
        return self.key(folder.url_of(name), size, etag, xxh3)

    def prefetch(self, folder: RemoteFolder, name: str, size: int, xxh3: str) -> bool:
        """Start downloading object ``name`` into the cache on a background thread of this
        process, unless it is cached or this process fetches it already; whether a download
        started. Not held once there: eviction may take it before its read (which then
        downloads it again); a failure is left to that read to report."""
        self.check_fits(size, f"object {folder.url_of(name)!r}")
        data = self._path(self._entry_key(folder, name, size, xxh3), ".data")
        if finished(data, size) is not None:
            return False
        # keyed by the object in this cache folder (another folder has its own)
        return in_background(str(data), lambda: self.open(folder, name, size, xxh3).close())

    def open_present(
        self, folder: RemoteFolder, name: str, size: int, xxh3: str
    ) -> CacheEntry | None:
        """Object ``name`` held from the cache if its checked download is there, else None."""
        data = self._path(self._entry_key(folder, name, size, xxh3), ".data")
        _trim_on_exit(self)
        try:  # the common miss costs one stat, no lock
            if finished(data, size) is None:
                return None
        except OSError as exc:  # the cache folder is a file, unreadable, ...
            raise self._unusable(exc) from exc
        use = lock(data.with_suffix(".lock"), fcntl.LOCK_SH)
        assert use is not None  # a blocking lock is always taken
        found = finished(data, size)
        if found is not None:
            with suppress(OSError):
                os.utime(data, follow_symlinks=False)  # least recently used goes first
            return CacheEntry(data, use, (found.st_dev, found.st_ino))
        release(use)  # evicted between the stat and the lock
        return None

    def open(
        self,
        folder: RemoteFolder,
        name: str,
        size: int,
        xxh3: str,
        bad: tuple[int, int] | None = None,
    ) -> CacheEntry:
        """Object ``name`` of ``folder`` (``size`` bytes, xxh3 ``xxh3`` as the manifest
        records), downloaded first unless cached; held until the entry is closed. ``bad``: the
        identity of a cached copy found corrupt (a record's xxh3 differs): unless another
        process replaced it already, it is downloaded again and renamed over (processes still
        reading it keep their open file, whole).

        Raises:
            PackerError: the object is larger than the limit, cannot be downloaded, or its
                download never matched the manifest's checksum.
        """
        url = folder.url_of(name)
        self.check_fits(size, f"object {url!r}")
        key = self._entry_key(folder, name, size, xxh3)
        _trim_on_exit(self)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            use = lock(self._path(key, ".lock"), fcntl.LOCK_SH)
        except OSError as exc:
            raise self._unusable(exc) from exc
        assert use is not None  # a blocking lock is always taken
        data = self._path(key, ".data")
        try:
            if finished(data, size, bad) is None:
                self._fill(folder, name, key, size, xxh3, bad)
            os.utime(data, follow_symlinks=False)  # least recently used goes first
            found = finished(data, size)
            if found is None:
                raise UnsafeCacheFile(f"{str(data)!r} was replaced while held; open it again")
        except BaseException as exc:
            release(use)
            if isinstance(exc, OSError):  # the network's are PackerErrors already (storage)
                raise self._unusable(exc) from exc
            raise
        return CacheEntry(data, use, (found.st_dev, found.st_ino))

    def _unusable(self, exc: OSError) -> PackerError:
        return PackerError(
            f"cannot use the shard cache {str(self.dir)!r}: {exc.strerror or exc}. Pass "
            "cache_dir= a writable folder on a local disk with room for cache_limit (or free "
            "space, or lower cache_limit)"
        )

    def _fill(
        self,
        folder: RemoteFolder,
        name: str,
        key: str,
        size: int,
        xxh3: str,
        bad: tuple[int, int] | None = None,
    ) -> None:
        """Download ``name`` into ``K.data`` unless another process does (then wait for it)
        or did (``K.data`` present, and not the ``bad`` copy)."""
        part, data = self._path(key, ".part"), self._path(key, ".data")
        fd = lock(part, fcntl.LOCK_EX)
        assert fd is not None
        try:
            if finished(data, size, bad) is not None:  # another process finished it meanwhile
                unlink_quietly(part)
                return
            meta = {"url": folder.url_of(name), "bytes": size, "xxh3_64": xxh3}
            meta["etag"] = folder.identity.get(name, (size, None))[1]
            write_new(self._path(key, ".json"), json.dumps(meta).encode())  # before the room:
            self._make_room(size, key)  # another process's room counts this download
            download(folder, name, fd, size, xxh3)
            os.rename(part, data)
        except BaseException:
            unlink_quietly(part)
            raise
        finally:
            release(fd)

    @contextmanager
    def _evicting(self) -> Iterator[None]:
        fd = lock(self.dir / _EVICT, fcntl.LOCK_EX)
        try:
            yield
        finally:
            release(fd)  # type: ignore[arg-type]

    def _make_room(self, needed: int, mine: str = "") -> None:
        """Evict unused objects, least recently used first, until ``needed`` more bytes fit
        under the limit beside the downloads other processes have under way (their ``K.json``
        sizes); objects in use stay: the excess is theirs."""
        if self.limit is None:
            return
        with self._evicting():
            self._sweep_parts()
            found = sorted(self._files(), key=lambda item: item[2])
            going = [key for key, _, _ in self._files(".part") if key != mine]
            total = sum(size for _, size, _ in found) + sum(map(self._planned, going))
            for key, size, _ in found:
                if total + needed <= self.limit:
                    break
                if self._remove(key):
                    total -= size

    def _remove(self, key: str) -> bool:
        """Remove object ``key`` unless a process holds it; whether it was removed (a link or
        a foreign file as its lock is no lock of this user's processes: removed with it)."""
        try:
            fd = lock(self._path(key, ".lock"), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except UnsafeCacheFile:
            unlink_quietly(self._path(key, ".lock"))
            fd = lock(self._path(key, ".lock"), fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return False
        try:
            unlink_quietly(
                self._path(key, ".data"), self._path(key, ".json"), self._path(key, ".lock")
            )
        finally:
            release(fd)
        return True

    def _sweep_parts(self) -> list[str]:
        """Remove the part files no process holds (their downloader died); their keys."""
        removed = []
        for path in self.dir.glob("*.part"):
            try:
                fd = lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
            except UnsafeCacheFile:  # a link or a foreign file: no download of this user's
                unlink_quietly(path)
                removed.append(path.stem)
                continue
            if fd is not None:
                unlink_quietly(path)
                release(fd)
                removed.append(path.stem)
        return removed

    def _files(self, suffix: str = ".data") -> list[tuple[str, int, float]]:
        """``(key, bytes, mtime)`` of every finished object (or part, ``suffix=".part"``)."""
        out = []
        for path in self.dir.glob("*" + suffix):
            try:
                st = path.lstat()  # a link's own size: its target is none of the cache's
            except FileNotFoundError:
                continue
            out.append((path.stem, st.st_size, st.st_mtime))
        return out

    def _in_use(self, path: Path) -> bool:
        try:
            fd = lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB, create=False)
        except UnsafeCacheFile:
            return False  # a link or a foreign file: none of this user's processes holds it
        if fd is None:
            return path.exists()
        release(fd)
        return False

    def entries(self) -> list[Cached]:
        """Every object in the cache (finished, then partial), most recently used first."""
        if not self.dir.is_dir():
            return []
        out = []
        for key, size, used in sorted(self._files(), key=lambda item: -item[2]):
            in_use = self._in_use(self._path(key, ".lock"))
            out.append(Cached(key, self._url(key), size, used, in_use))
        for key, size, used in self._files(".part"):
            in_use = self._in_use(self._path(key, ".part"))
            out.append(Cached(key, self._url(key), size, used, in_use, partial=True))
        return out

    def _meta(self, key: str, field: str, default: Any) -> Any:
        """``field`` of what object ``key`` is (its ``K.json``), or ``default`` if unreadable."""
        try:
            return type(default)(json.loads(self._path(key, ".json").read_text())[field])
        except (OSError, ValueError, KeyError, TypeError):
            return default

    def _planned(self, key: str) -> int:  # a download under way's size (its K.json; or 0)
        return int(self._meta(key, "bytes", 0))

    def _url(self, key: str) -> str:
        return str(self._meta(key, "url", "?"))

    def clear(self) -> tuple[list[Cached], list[Cached]]:
        """Remove every object no process holds, and stale partial downloads; returns
        ``(removed, skipped because in use)``."""
        removed: list[Cached] = []
        skipped: list[Cached] = []
        if not self.dir.is_dir():
            return removed, skipped
        with suppress(FileNotFoundError):  # a planted link or file is no process's lock
            if own_file((self.dir / _EVICT).lstat()) is not None:
                unlink_quietly(self.dir / _EVICT)
        with self._evicting():
            found = self.entries()
            swept = set(self._sweep_parts())
            for entry in found:
                gone = entry.key in swept if entry.partial else self._remove(entry.key)
                (removed if gone else skipped).append(entry)
            for path in self.dir.glob("*.lock"):  # locks of objects never finished
                if not self._path(path.stem, ".data").exists():
                    self._remove(path.stem)
        return removed, skipped
