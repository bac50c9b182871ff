"""Upload a finished local packer output to a URL (``s3://bucket/out.lmdb``, any writable fsspec
store) so that a reader never sees a half dataset, and an interrupted upload resumes.

A reader opens a dataset through its ``packer.json``; so the order is:

1. the destination is checked: empty, or a packer dataset (its ``packer.json``) only with
   ``overwrite``, or an upload of ours that a kill interrupted (recorded in the journal);
2. with ``overwrite``, the old manifests are deleted first (the top one, then those of the
   splits it names; no other object named ``packer.json``), so no reader opens the old dataset
   while its objects are replaced;
3. every data file and table is uploaded (small ones several at once, a large one alone,
   multipart as the backend does it: s3fs from 100 MiB, in 50 MiB parts, 4 in flight, so
   memory stays near 200 MiB), then each split's ``packer.json``, then the top one last;
4. objects of an old output that the new one does not have are deleted: only those the old
   manifests list or this upload's journal knows (:mod:`packer.upload.owned`); any other object
   under the prefix is kept, and a prefix without a manifest that holds objects packer did not
   write there is refused.

Each finished upload appends one line to a journal in the staging folder (the local file's
size and mtime, the object's size and ETag). Another run with ``resume`` skips an object whose
journal line matches both the local file and the store's listing; a lost or torn line costs
one upload again, never a wrong object. Passing failures (resets, 429, 5xx) are retried with
the backoff of :data:`packer.remote.storage.RETRY`; every error names the URL.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, TypeVar

from packer.core.manifest import MANIFEST_NAME, file_checksum
from packer.core.retry import retried
from packer.core.sizes import bounds_hint
from packer.errors import DatasetExistsError, DestinationError, PackerError
from packer.remote.failures import failure
from packer.remote.storage import RemoteFolder, join_url, passing
from packer.upload.journal import JOURNAL_NAME, Journal
from packer.upload.owned import (
    expected_checksums,
    is_manifest,
    listed_by_manifests,
    old_manifests,
    upload_order,
)
from packer.upload.report import Sent, UploadReport, progress_bar

__all__ = [
    "JOURNAL_NAME",
    "DatasetExistsError",
    "Journal",
    "UploadReport",
    "Uploader",
    "upload_order",
]

T = TypeVar("T")
THREADS = 8  # small objects in flight together (small per-sample files need many)
LARGE = 16 << 20  # a file this large is sent alone (s3fs holds a file < 100 MiB in memory)
PARTS = 4  # parts of one multipart upload in flight (s3fs: 50 MiB each): ~200 MiB of memory
_READ_ONLY = ("http", "https")
_AGAIN = "run the same command again with --resume (finished objects are not sent again)"
_NOTHING_WRITTEN = (
    "nothing was written to it. Check the endpoint (--storage-option endpoint_url=...) and that "
    "the store is up, then run the command again"
)


class Uploader:
    """Writes one packer output at ``url`` through fsspec (see the module's docstring).

    Args:
        url: the dataset's URL (``s3://bucket/out.lmdb``).
        storage_options: the fsspec options (``endpoint_url``, ...).
        journal: the journal of this upload (in the staging folder).
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None,
        journal: Journal,
        resume: bool = False,
    ) -> None:
        protocol = url.split("://", 1)[0].lower()
        if protocol in _READ_ONLY:
            raise PackerError(
                f"cannot write to {url!r}: an {protocol}:// URL is read-only. Write to the "
                "store behind it (s3://, gs://, az://, ...) and read the dataset over HTTP"
            )
        self.folder = RemoteFolder(url, storage_options)
        self.url = self.folder.url
        self.journal, self.resume = journal, resume
        self.wrote = journal.owned_now()  # the store may hold objects of ours: --resume helps

    def attempt(self, url: str, what: str, request: Callable[[], T]) -> T:
        """``request()``, tried again after a passing failure (the backoff of
        :data:`packer.remote.storage.RETRY`).

        Raises:
            DestinationError: naming ``url``, what was done and the attempts made.
        """
        from packer.remote import storage

        def retry_on(exc: Exception) -> bool:
            if not passing(exc):
                raise DestinationError(
                    f"cannot {what} {url!r}: {_failure(exc)}. Check the URL, the credentials "
                    "(AWS_ACCESS_KEY_ID, a profile, an instance role), that the bucket exists "
                    "and is writable, and the endpoint (--storage-option endpoint_url=...)"
                ) from exc
            return True

        def give_up(exc: Exception, attempts: int, spent: float) -> DestinationError:
            then = _AGAIN if self.wrote else _NOTHING_WRITTEN
            return DestinationError(
                f"cannot {what} {url!r}: {attempts} attempts over {spent:.1f}s all failed, the "
                f"last with {_failure(exc)}. The store is unreachable, overloaded or "
                f"throttling; {then}" + bounds_hint(self.folder.bounds, exc)
            )

        return retried(storage.RETRY, lambda _: request(), retry_on, give_up)

    def listing(self) -> dict[str, tuple[int, str | None]]:
        """Every object under the dataset's URL: ``{relative name: (size, ETag)}``."""
        fs = self.folder.fs()
        root = fs._strip_protocol(self.url).rstrip("/") + "/"

        def find() -> dict[str, Any]:
            fs.invalidate_cache()
            return dict(fs.find(self.url, detail=True, **self.folder.limit()))

        found = self.attempt(self.url, "list", find)
        out = {}
        for path, entry in found.items():
            if str(path).startswith(root) and entry.get("type", "file") == "file":
                tag = entry.get("ETag") or entry.get("etag")
                out[str(path)[len(root) :]] = (int(entry.get("size") or 0), tag and str(tag))
        return out

    def ours(
        self,
        name: str,
        local: Path,
        listing: dict[str, tuple[int, str | None]],
        expected: str | None = None,
    ) -> bool:
        """Whether the object ``name`` is the upload of ``local`` (or of its released copy)
        this journal recorded, sent from bytes whose xxh3 is ``expected`` where known."""
        return self.journal.holds(name, local, listing.get(name), expected)

    def sent_here(self, name: str, local: Path, listing: dict[str, tuple[int, str | None]]) -> bool:
        """Whether the manifest ``name`` at the store is this upload's of ``local``: journaled
        (:meth:`ours`), or begun from here and holding ``local``'s very bytes, its journal line
        lost (a kill between the PUT and the line, a HEAD that failed after the PUT): then
        journaled now, so ``--resume`` finishes the upload instead of refusing its own work."""
        if self.ours(name, local, listing):
            return True
        if name not in self.journal.sending or name not in listing or not local.is_file():
            return False
        st, (size, etag) = local.stat(), listing[name]
        if size != st.st_size or self.cat(name) != local.read_bytes():
            return False
        self.journal.record(name, st, size, etag, file_checksum(local))
        return True

    def check(
        self, overwrite: bool, staged: Path | None = None
    ) -> dict[str, tuple[int, str | None]]:
        """Refuse a destination this upload may not write (see the module's docstring);
        return its listing.

        Args:
            overwrite: a packer dataset already there may be replaced.
            staged: the local output about to be uploaded (None before it is built).
        """
        listing = self.listing()
        if not listing:
            return listing
        mine = (  # resumed after its manifest was uploaded (its journal line maybe lost)
            self.resume
            and staged is not None
            and self.sent_here(MANIFEST_NAME, staged / MANIFEST_NAME, listing)
        )
        if MANIFEST_NAME in listing and not (overwrite or mine):
            raise DatasetExistsError(
                f"{self.url!r} already holds a packer dataset (its {MANIFEST_NAME}). Pass "
                "--overwrite to replace it (its manifest is deleted first, so no reader mixes "
                "the two), or choose another URL"
            )
        if MANIFEST_NAME not in listing:
            ours = self.journal.known(sorted(listing)) if self.journal.owned_now() else set()
            foreign = sorted(set(listing) - ours)
            if foreign:
                raise DestinationError(
                    f"{self.url!r} holds {len(foreign)} object(s) packer did not write there "
                    f"(e.g. {foreign[0]!r}) and no {MANIFEST_NAME}: not a packer dataset, or an "
                    "upload whose staging folder is gone (or was made for another endpoint or "
                    "options). packer writes only to an empty prefix, over a packer dataset, "
                    "or over its own interrupted upload; delete those objects first or choose "
                    "another URL"
                )
        return listing

    def begin(self, overwrite: bool, staged: Path) -> dict[str, tuple[int, str | None]]:
        """Before the first object is sent: refuse a destination this upload may not write
        (:meth:`check`), then delete the old manifests (no reader opens an old dataset whose
        objects are being replaced); return the listing left."""
        listing = self.check(overwrite, staged)
        self.journal.claim(self.url)  # a --part task's first shard: the objects are ours now
        if MANIFEST_NAME in listing:  # over a dataset: what its manifests list may go
            old = listed_by_manifests(self.cat, listing)
            self.journal.adopt(old, set(listing) - old - self.journal.known(sorted(listing)))
        self._drop_old_manifests(staged, listing)
        return listing

    def cat(self, name: str) -> bytes:
        """The bytes of the object ``name`` under the dataset's URL (retried)."""
        url, fs = join_url(self.url, name), self.folder.fs()
        return self.attempt(url, "read", lambda: bytes(fs.cat_file(url, **self.folder.limit())))

    def upload(self, staged: Path, overwrite: bool, progress: bool = True) -> UploadReport:
        """Upload the finished output ``staged`` (the module's order); return what was done.

        Raises:
            DestinationError: the destination refused (:meth:`check`), an upload failed, or an
                object released from staging (:mod:`packer.upload.stream`) is gone.
        """
        began = time.perf_counter()
        listing = self.begin(overwrite, staged)
        names = upload_order(staged)
        sums = expected_checksums(staged)
        todo = [n for n in names if not self.ours(n, staged / n, listing, sums.get(n))]
        self._check_released(staged, todo, sums)
        report = UploadReport(self.url, skipped=len(names) - len(todo))
        total = sum((staged / n).stat().st_size for n in todo)
        manifests = [n for n in todo if is_manifest(n)]  # deepest first, the top one last
        data = [n for n in todo if not is_manifest(n)]
        small = [n for n in data if (staged / n).stat().st_size < LARGE]
        with progress_bar(total, progress) as bar:
            self.put_many([(staged / n, n) for n in small], bar, sums)
            for name in sorted(set(data) - set(small)):  # one at a time: bounded memory
                self.put(staged / name, name, bar, sums.get(name))
            for name in manifests:  # one at a time, once every data file is there
                self.put(staged / name, name, bar)
        stale = sorted(self.journal.deletable(set(listing) - set(names)))  # never a user's
        if stale:
            fs = self.folder.fs()
            urls = [join_url(self.url, n) for n in stale]
            self.attempt(
                self.url, "delete stale objects under", lambda: fs.rm(urls, **self.folder.limit(0))
            )
        report.uploaded, report.removed = len(todo), len(stale)
        report.bytes, report.seconds = total, time.perf_counter() - began
        return report

    def _check_released(self, staged: Path, todo: list[str], sums: dict[str, str]) -> None:
        """Refuse to send an object whose staged copy was released after an earlier upload
        (its bytes are gone locally, whatever point of the release a kill came at) but which
        the store no longer holds as uploaded."""
        gone = [n for n in todo if self.journal.released(n, staged / n, sums.get(n))]
        if gone:
            raise DestinationError(
                f"{join_url(self.url, gone[0])!r} (and {len(gone) - 1} more) was uploaded during "
                "the conversion and its staged copy released, but the store no longer holds it "
                "as uploaded (deleted or replaced since): it cannot be sent again. Convert again "
                "without --resume (with --overwrite)"
            )

    def _drop_old_manifests(self, staged: Path, listing: dict[str, tuple[int, str | None]]) -> None:
        """Delete the old dataset's manifests (the top one first, then the splits it names:
        :func:`packer.upload.owned.old_manifests`) and those an earlier upload from here sent,
        but not this upload's, so that no reader opens an old dataset whose objects are being
        replaced. Another object named ``packer.json`` (a user's nested dataset) is kept."""
        sent = self.journal.deletable({n for n in listing if is_manifest(n)})
        old = sorted(set(old_manifests(self.cat, listing)) | sent)
        old = [n for n in old if not (self.resume and self.sent_here(n, staged / n, listing))]
        fs = self.folder.fs()
        for name in sorted(old, key=lambda n: (n.count("/"), n)):
            url, self.wrote = join_url(self.url, name), True
            self.attempt(
                url,
                "delete the old manifest",
                functools.partial(fs.rm_file, url, **self.folder.limit(0)),
            )
            del listing[name]

    def put_many(
        self, pairs: list[tuple[Path, str]], bar: Any, sums: dict[str, str] | None = None
    ) -> None:
        """Upload each ``(local file, object name)`` several at once (each checked against
        its xxh3 in ``sums``, where given); the first failure cancels the rest and raises."""
        if not pairs:
            return
        sums = sums or {}
        with ThreadPoolExecutor(min(THREADS, len(pairs)), thread_name_prefix="upload") as pool:
            futures = [
                pool.submit(self.put, local, name, bar, sums.get(name)) for local, name in pairs
            ]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for future in pending:
                future.cancel()
            for future in futures:
                if future.done() and not future.cancelled():
                    future.result()  # raises the first failure

    def put(self, local: Path, name: str, bar: Any, expected: str | None = None) -> None:
        """Upload the file ``local`` as the object ``name``, check the object's size, record
        it in the journal (with the xxh3 of the bytes sent).

        Raises:
            DestinationError: ``local``'s bytes do not hash to ``expected`` (the xxh3 the
                manifest records for it): nothing is sent.
        """
        url = join_url(self.url, name)
        st = local.stat()
        self.journal.intend(name)
        self.wrote = True
        found = file_checksum(local)
        if expected is not None and found != expected:
            raise DestinationError(
                f"refusing to upload {str(local)!r} to {url!r}: its bytes (xxh3 {found}) differ "
                f"from the checksum its manifest records ({expected}); the staged copy was "
                "damaged or emptied after it was written. Nothing was sent for it; convert "
                "again with --overwrite"
            )
        fs = self.folder.fs()
        s3 = self.url.split("://", 1)[0] in ("s3", "s3a")
        extra = {"max_concurrency": PARTS} if s3 and st.st_size >= LARGE else {}

        def put() -> tuple[int, str | None]:
            sent = Sent(bar)
            try:
                bound = self.folder.limit(st.st_size)  # cancelled past it: never a hang
                fs.put_file(str(local), url, callback=sent.callback(), **extra, **bound)
            except BaseException:
                sent.undo()
                raise
            fs.invalidate_cache(url)
            info = fs.info(url, **self.folder.limit(0))
            return int(info.get("size") or 0), _etag(info)

        size, etag = self.attempt(url, "upload to", put)
        if size != st.st_size:
            raise DestinationError(
                f"uploaded {str(local)!r} to {url!r} but the store holds {size} bytes, not "
                f"{st.st_size}: the store truncated it; run the same command with --resume"
            )
        self.journal.record(name, st, size, etag, found)


def _etag(info: dict[str, Any]) -> str | None:
    tag = info.get("ETag") or info.get("etag")
    return str(tag) if tag else None


def _failure(exc: BaseException) -> str:
    return failure(exc)  # the watchdog's reason when it cut a stalled PUT, not "could not connect"
