"""A cache download: an object written into its part file by ranged GETs, checked against the
manifest's size and xxh3 before it may be renamed into the cache (``packer.remote.cache``)."""

from __future__ import annotations

import os

from packer.core.retry import retried
from packer.errors import FormatError
from packer.remote import storage
from packer.remote.storage import RemoteFolder

__all__ = ["CorruptDownload", "download"]


class CorruptDownload(FormatError):
    """Every download of an object gave other bytes than the manifest's checksum."""


class _OtherBytes(Exception):
    """A download whose xxh3 is not the manifest's (its text: the xxh3 found)."""


def download(folder: RemoteFolder, name: str, fd: int, size: int, xxh3: str) -> None:
    """Download ``name`` into ``fd``, checked against ``size`` and ``xxh3`` before it may be
    used; a body that does not match is downloaded again, up to :data:`RETRY`'s attempts, then
    :class:`CorruptDownload`."""
    url = folder.url_of(name)

    def try_once(_: int) -> None:
        found = folder.download(name, fd, size)
        if found != xxh3:
            raise _OtherBytes(found)
        os.fdatasync(fd)

    def retry_on(exc: Exception) -> bool:
        if isinstance(exc, _OtherBytes):
            folder.check_unchanged(url)  # an object replaced since the open: said at once
        return isinstance(exc, _OtherBytes)

    def give_up(exc: Exception, attempts: int, spent: float) -> CorruptDownload:
        where = (  # a local dataset staged through the cache: its file is damaged on the disk
            "The file is damaged on its disk; run packer verify on it and convert it again"
            if url.startswith("file:")
            else "The object is corrupt in the store or on the way; upload the dataset again "
            "or check the network"
        )
        return CorruptDownload(
            f"cannot cache {url!r}: {attempts} downloads over {spent:.1f}s all gave bytes whose "
            f"xxh3 differs from the manifest's ({xxh3}; last {exc}). {where}"
        )

    retried(storage.RETRY, try_once, retry_on, give_up)
