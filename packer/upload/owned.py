"""Which objects under a dataset's URL are packer's to delete (issue 28, findings 2 and 3).

An upload deletes an object only when it knows packer wrote it: the old dataset's manifests
(the top ``packer.json`` and the splits it names, :func:`old_manifests`; no other object named
``packer.json``) list it (``--overwrite`` replaces that dataset: its manifests, tables, shards and, in a
per-sample layout, each sample's files, named from its ``keys.txt`` and ``index.npy``), or this
staging folder's journal says it was sent (an upload of ours that a kill interrupted). A user's
``notes/README.txt`` or ``checkpoints/model.pt`` inside the prefix is neither, and is kept.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import xxhash

from packer.core.manifest import (
    INDEX_NAME,
    KEYS_NAME,
    MANIFEST_NAME,
    decode_keys,
    load_manifest,
    parse_manifest,
)
from packer.errors import PackerError

__all__ = [
    "expected_checksums",
    "is_manifest",
    "listed_by_manifests",
    "old_manifests",
    "sample_files",
    "upload_order",
]


def sample_files(
    fmt: ModuleType, kind: str, keys: Sequence[str], counts: Sequence[int]
) -> list[str]:
    """The files of a per-sample layout holding ``keys`` (with ``counts`` records each),
    relative to the dataset: one per record (BMP) or one per sample (``key`` + its suffix)."""
    record_name = getattr(fmt, "record_name", None)
    suffix = getattr(fmt.Reader, "SAMPLE_SUFFIX", "")
    names: list[str] = []
    for key, count in zip(keys, counts):
        if record_name is not None:
            names += [record_name(key, kind, n) for n in range(count)]
        else:
            names.append(key + suffix)
    return names


def old_manifests(cat: Any, listing: dict[str, Any]) -> list[str]:
    """The manifests of the dataset in ``listing`` (relative names), the top one first: its
    ``packer.json`` and, for a root of splits, the ``<split>/packer.json`` of each split it
    names. Nothing else is, whatever its name: a user's nested copy of a dataset
    (``mycopy-v1.npy/packer.json``) or a ``train/packer.json`` the top manifest does not name.
    ``cat(name)`` returns an object's bytes; an unreadable top manifest names no split."""
    if MANIFEST_NAME not in listing:
        return []
    names = [MANIFEST_NAME]
    try:
        top = parse_manifest(cat(MANIFEST_NAME), MANIFEST_NAME, ".")
    except (PackerError, OSError, ValueError):
        return names
    for split in sorted(top.opts.splits) if top.kind == "splits" else []:
        name = f"{split}/{MANIFEST_NAME}"
        plain = isinstance(split, str) and "/" not in split and split not in ("", ".", "..")
        if plain and name in listing:
            names.append(name)
    return names


def listed_by_manifests(cat: Any, listing: dict[str, Any]) -> set[str]:
    """The names in ``listing`` (relative to the dataset's URL) that the dataset's manifests
    (:func:`old_manifests`) list, the manifests included. ``cat(name)`` returns an object's
    bytes. A manifest or table that cannot be read or fails its checksum lists only what could
    be read."""
    from packer.formats import by_name

    owned: set[str] = set()
    for name in old_manifests(cat, listing):
        prefix = name[: -len(MANIFEST_NAME)]
        owned.add(name)
        try:
            manifest = parse_manifest(cat(name), name, prefix or ".")
        except (PackerError, OSError, ValueError):
            continue
        owned.update(prefix + s.name for s in manifest.shards)
        owned.update(prefix + f for f in manifest.files)
        if manifest.opts.layout != "per-sample":
            continue
        try:
            keys = decode_keys(_checked(cat, prefix, KEYS_NAME, manifest.files))
            index = np.load(io.BytesIO(_checked(cat, prefix, INDEX_NAME, manifest.files)))
            fmt = by_name(manifest.format)
        except (PackerError, OSError, ValueError):
            continue
        counts = index["count"].tolist() if len(index) == len(keys) else [1] * len(keys)
        owned.update(prefix + n for n in sample_files(fmt, manifest.kind, keys, counts))
    return owned & set(listing)


def _checked(cat: Any, prefix: str, table: str, sums: dict[str, str]) -> bytes:
    data = bytes(cat(prefix + table))
    if xxhash.xxh3_64_hexdigest(data) != sums.get(table):
        raise PackerError(f"{prefix + table} differs from its manifest's checksum")
    return data


def expected_checksums(folder: Path) -> dict[str, str]:
    """The xxh3 that the manifests of the finished output ``folder`` (the top one and each
    split's) record for its shard files and tables, by relative name."""
    sums: dict[str, str] = {}
    for path in sorted(folder.rglob(MANIFEST_NAME)):
        prefix = "".join(p + "/" for p in path.parent.relative_to(folder).parts)
        manifest = load_manifest(path.parent)
        sums.update({prefix + s.name: s.xxh3_64 for s in manifest.shards})
        sums.update({prefix + n: h for n, h in manifest.files.items()})
    return sums


def upload_order(folder: Path) -> list[str]:
    """The files of ``folder`` (relative POSIX names) in upload order: every data file and
    table (sorted), then the manifests, deepest first, the top ``packer.json`` last."""
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    data = [n for n in names if not is_manifest(n)]
    manifests = sorted(set(names) - set(data), key=lambda n: (-n.count("/"), n))
    return data + manifests


def is_manifest(name: str) -> bool:
    """Whether the relative ``name`` is a manifest (the top one or a split's)."""
    return name.rsplit("/", 1)[-1] == MANIFEST_NAME
