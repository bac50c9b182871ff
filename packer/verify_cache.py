"""``verify`` of a URL through the node-local shard cache (``cache_dir=``, and LMDB always): each
shard is downloaded into the cache, where the download is checked against the manifest's size
and xxh3 (:meth:`packer.cache.ShardCache.open`) instead of being streamed through xxh3 and
dropped. One download per shard checks it and leaves the dataset warm: the records are then
checked from the cache, and the next epoch reads no shard from the store."""

from __future__ import annotations

from collections.abc import Callable

from packer.cache import CorruptDownload, ShardCache
from packer.errors import PackerError
from packer.manifest import Manifest
from packer.storage import RemoteFolder

__all__ = ["cache_check"]

Check = Callable[[str, str, "int | None"], "str | None"]


def cache_check(
    folder: RemoteFolder, cache: ShardCache, manifest: Manifest, stream: Check, differs: str
) -> Check:
    """A ``check(name, xxh3, size)`` for ``verify``: a shard's size from one listing, its bytes
    downloaded into ``cache`` and checked there; a table (size None) by ``stream``. ``differs``
    is the finding for bytes that do not match the manifest's xxh3."""
    listed = folder.sizes([s.name for s in manifest.shards])

    def check(name: str, digest: str, size: int | None) -> str | None:
        if size is None:
            return stream(name, digest, size)
        found = listed.get(name)
        if found is None:
            return f"cannot be read: missing from the listing of {folder.url!r}"
        if found != size:
            return f"{found} bytes, manifest records {size}"
        try:
            cache.open(folder, name, size, digest).close()
        except CorruptDownload:
            return differs
        except PackerError as exc:
            return f"cannot be read: {exc}"
        return None

    return check
