"""Describe a packed dataset for ``packer inspect``: returns text, never prints.

The tables are opened as readers open them (``store.open_packed``, data files left alone), so a
damaged or crafted table is refused with the same :class:`~packer.errors.FormatError` a reader
would raise, never counted or shown.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from packer.core.contained import check_relative
from packer.core.fields import ABSENT, kind_noun
from packer.core.manifest import load_manifest
from packer.core.sizes import format_size
from packer.errors import FormatError
from packer.read.describe_audio import audio_lines, audio_stats
from packer.read.store import Packed, open_packed
from packer.remote.opener import url_manifest
from packer.remote.storage import is_url, join_url

__all__ = ["describe", "field_stats", "inspect_dict", "per_class"]


def per_class(packed: Packed) -> list[int]:
    """Samples per class (``open_packed`` checked every label lies in the class range)."""
    if packed.manifest.kind == "fields":
        return []
    return np.bincount(packed.labels, minlength=len(packed.manifest.classes)).tolist()


def field_stats(packed: Packed) -> list[dict[str, Any]]:
    """Each field of a dataset with fields: its name, kind, how many samples have it and its
    stored bytes in all (none for a class-folder dataset)."""
    out = []
    for j, spec in enumerate(packed.manifest.opts.fields):
        records = packed.first + j
        absent = (packed.reader.length[records] == 0) & (packed.checksums[records] == ABSENT)
        stored = int(packed.reader.length[records].sum(dtype=np.int64))
        present = len(records) - int(absent.sum())
        out.append({"name": spec.name, "kind": spec.kind, "samples": present, "bytes": stored})
    return out


def describe(
    path: str | os.PathLike[str],
    show_skipped: bool = False,
    num_keys: int = 5,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """A human-readable description of the packed dataset at ``path`` (a folder or a URL,
    read through ``storage_options``)."""
    root = _root(path)
    packed = _open(root, storage_options)
    m = packed.manifest
    counts = per_class(packed)
    storage = m.opts.storage
    lines = [
        f"{root}: packer {m.format} dataset (layout v{m.layout_version}, {kind_noun(m.kind)})",
        f"samples: {m.num_samples}    "
        + (f"fields: {len(m.opts.fields)}    " if m.kind == "fields" else "")
        + (f"classes: {len(m.classes)}    " if m.kind != "fields" else "")
        + f"stored bytes: {format_size(int(storage.get('record_bytes', 0)))}    created: {m.created}",
        f"source: {m.source.get('root')} ({m.source.get('files')} files, "
        f"{format_size(m.source.get('bytes', 0))})",
    ]
    if m.kind == "fields":
        lines += [
            f"field {f['name']} ({f['kind']}): {f['samples']} samples, {format_size(f['bytes'])}"
            for f in field_stats(packed)
        ]
        if not is_url(root):  # every clip is read: not over a network
            lines += audio_lines(audio_stats(packed))
    else:
        shown = ", ".join(f"{c} ({n})" for c, n in list(zip(m.classes, counts))[:8])
        lines.append("classes: " + shown + (" ..." if len(m.classes) > 8 else ""))
    if m.shards:
        lines.append(f"shards: {len(m.shards)} ({format_size(m.data_bytes)})")
        unit = {"video": "frames", "fields": "records"}.get(m.kind, "samples")  # records
        for shard in m.shards[:5]:
            lines.append(f"  {shard.name}: {shard.samples} {unit}, {format_size(shard.bytes)}")
        if len(m.shards) > 5:
            lines.append(f"  ... {len(m.shards) - 5} more")
    else:
        lines.append(f"files: one per sample ({m.num_samples})")
    if num_keys > 0:
        keys = packed.reader.keys
        lines.append(
            "keys: " + ", ".join(keys[:num_keys]) + (" ..." if len(keys) > num_keys else "")
        )
    if m.opts.pixels:
        shape = "×".join(str(n) for n in m.opts.pixels)
        lines.append(f"pixels: {shape} uint8 per sample, decoded at conversion (no decode at read)")
    resize = m.opts.resize
    if resize:
        limit = (
            f"short side {resize.short_side}"
            if resize.short_side
            else f"max side {resize.max_side}"
            if resize.max_side
            else "no size limit"
        )
        kept = "every image re-encoded" if resize.reencode else "smaller images kept as found"
        lines.append(f"resize: {limit}, quality {resize.quality} ({kept})")
    lines.append(f"skipped inputs: {len(m.skipped)}")
    if show_skipped:
        lines += [f"  {s['path']}: {s['reason']}" for s in m.skipped]
    elif m.skipped:
        lines.append("  (list them with --skipped)")
    return "\n".join(lines)


def _root(path: str | os.PathLike[str]) -> Any:
    return str(path) if is_url(path) else Path(path)


def _split(root: Any, name: str) -> Any:
    """Split ``name`` of the output at ``root`` (a plain folder name, else refused)."""
    if "/" in check_relative(name, "split name"):
        raise FormatError(f"split name {name!r} of {str(root)!r} is not a plain folder name")
    return join_url(root, name) if isinstance(root, str) else root / name


def _open(root: Any, storage_options: dict[str, Any] | None) -> Packed:
    if storage_options is not None:  # a URL (a local path is refused by open_packed)
        return open_packed(root, check_files=False, storage_options=storage_options)
    return open_packed(root, check_files=False)


def inspect_dict(
    path: str | os.PathLike[str], storage_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What ``packer inspect --json`` prints: the manifest's facts, counts per class and split.
    A URL is read through ``storage_options``."""
    root = _root(path)
    m = url_manifest(root, storage_options) if is_url(path) else load_manifest(root)
    packed = None if m.kind == "splits" else _open(root, storage_options)
    m = packed.manifest if packed is not None else m
    out: dict[str, Any] = {
        "path": str(root),
        "format": m.format,
        "kind": m.kind,
        "layout_version": m.layout_version,
        "samples": m.num_samples,
        "classes": list(m.classes),
        "created": m.created,
        "packer_version": m.packer_version,
        "source": m.source,
        "options": m.options,
        "shards": [{"name": s.name, "records": s.samples, "bytes": s.bytes} for s in m.shards],
        "skipped": m.skipped,
    }
    if packed is None:
        out["splits"] = {
            name: inspect_dict(_split(root, name), storage_options) for name in m.opts.splits
        }
        return out
    out["per_class"] = per_class(packed)
    if m.kind == "fields":
        out["fields"] = field_stats(packed)
        audio = [] if is_url(root) else audio_stats(packed)
        if audio:
            out["audio"] = audio
    if m.kind == "video":
        out["frames"] = int(packed.counts.sum())
    return out
