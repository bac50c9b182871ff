"""WebDataset tars at a URL as a conversion's source: the shards fetched into a local folder first.

A source URL is a tar or a brace pattern of them (``s3://bucket/shards/{000000..000099}.tar``,
``https://host/data/{a,b}.tar``). Each shard is downloaded by ranged GETs (retried as every
request is: :class:`packer.remote.storage.RemoteFolder`) into
``$PACKER_CACHE_DIR/sources/<hash of the URL>/`` as ``NNNNNN-<name>`` (the pattern's order), then
the conversion reads that folder as local tars. A shard already there is not fetched again when
it is of the same object (size and ETag, when the store gives one) and still holds the bytes it
was fetched with (its xxh3, recorded beside it): an interrupted conversion's ``--resume`` does
not download twice, and an object replaced at the source or a copy damaged here is fetched
anew. A shard is written under a temporary name and renamed once complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from packer.core.cpus import packer_home
from packer.errors import PackerError, SourceError
from packer.remote.storage import RemoteFolder
from packer.source.tars import COMPRESSED, expand_braces, shard_tag, unique_names

__all__ = ["fetch_object", "fetch_tars", "source_folder"]


def source_folder(url: str) -> Path:
    """Where the shards of source ``url`` are fetched to."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return packer_home() / "sources" / digest


def fetch_tars(
    url: str, storage_options: dict[str, Any] | None = None, folder: Path | None = None
) -> Path:
    """Fetch the tar shards ``url`` names into a local folder (:func:`source_folder` by
    default) and return it.

    Raises:
        SourceError: the URL names no ``.tar`` (or a compressed one), or a shard is missing.
        PackerError: the store cannot be reached (after retries).
    """
    urls = unique_names(expand_braces(url))  # a shard named twice is fetched (and read) once
    bad = [u for u in urls if not u.lower().endswith(".tar") or u.lower().endswith(COMPRESSED)]
    if bad:
        raise SourceError(
            f"a source URL must name WebDataset .tar shards (uncompressed); {bad[0]!r} is not one"
        )
    target = folder or source_folder(url)
    target.mkdir(parents=True, exist_ok=True)
    width = max(6, len(str(len(urls))))
    by_folder: dict[str, list[tuple[int, str]]] = {}
    for i, shard in enumerate(urls):
        parent, _, name = shard.rpartition("/")
        by_folder.setdefault(parent, []).append((i, name))
    for parent, shards in by_folder.items():
        remote = RemoteFolder(parent, storage_options)
        sizes = remote.sizes([name for _, name in shards])
        missing = [name for _, name in shards if name not in sizes]
        if missing:
            raise SourceError(f"shard {parent + '/' + missing[0]!r} does not exist (from {url!r})")
        for i, name in shards:
            _fetch(remote, name, sizes[name], target / f"{i:0{width}d}-{name}")
    return target


def _fetch(remote: RemoteFolder, name: str, size: int, path: Path) -> None:
    """Download object ``name`` (``size`` bytes) to ``path`` unless the copy there is of this
    same object (size and ETag, when the store gives one) and still holds the bytes it was
    fetched with (xxh3, recorded beside it)."""
    tag = shard_tag(remote, name, size)  # ETag; for HTTP(S) ETag or Last-Modified (a HEAD)
    record = path.with_name(f".{path.name}.fetched.json")
    try:
        kept = json.loads(record.read_text())
        if (
            isinstance(kept, dict)
            and kept == {"size": size, "tag": tag, "xxh3": kept.get("xxh3")}
            and _digest(path) == kept["xxh3"]
        ):
            return
    except (OSError, ValueError):
        pass  # not fetched yet, or its record is damaged: fetch it
    record.unlink(missing_ok=True)
    partial = path.with_name(f".{path.name}.fetching")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        digest = remote.download(name, fd, size)
        os.fsync(fd)
    except OSError as exc:
        raise PackerError(f"cannot write {str(partial)!r}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    os.replace(partial, path)
    record.write_text(json.dumps({"size": size, "tag": tag, "xxh3": digest}))


fetch_object = _fetch  # one object fetched as a shard is (write/hf: Parquet files at a URL)


def _digest(path: Path) -> str:
    """The xxh3_64 hex digest of a file's bytes (as :meth:`RemoteFolder.download` gives it)."""
    import xxhash

    digest = xxhash.xxh3_64()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()
