"""What every source of samples with fields scans into: samples of named parts, no byte read.

A :class:`FieldSample` is a key and its :class:`Part`\\ s, one per field: a whole file (key-grouped
files, a table's image column), a byte range of a file (a member of a WebDataset tar), or a
value already in memory (a table's caption cell, a COCO image's annotations as JSON). The loader
(:mod:`packer.write.fields`) reads each part, checks it by its field's kind and stores the
sample as one record per field of the :class:`FieldScan`'s ``fields``, in their order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from packer.core.fields import MAX_FIELDS, FieldSpec, check_field_name, field_kind
from packer.errors import SourceError
from packer.source.images import Scan, SkippedInput

__all__ = [
    "FieldSample",
    "FieldScan",
    "Part",
    "declare_fields",
    "finish_scan",
    "fold_case_duplicates",
    "keep_required",
    "sample_of",
    "why_none",
]


@dataclass(frozen=True, slots=True)
class Part:
    """One field of one sample: ``data`` when given, else ``size`` bytes of file ``path`` from
    byte ``offset`` (``-1``: the whole file, checked to be ``size`` bytes when read)."""

    field: str
    path: str
    size: int
    offset: int = -1
    data: bytes | None = None


@dataclass(frozen=True, slots=True)
class FieldSample:
    """One sample: its key, its parts (field order) and their bytes in all (``size``, which
    plans the shards); ``path`` names it in skip reasons; ``label`` is -1 (no class index)."""

    key: str
    path: str
    size: int
    parts: tuple[Part, ...]
    label: int = -1

    @property
    def files(self) -> tuple[str, ...]:
        """The source files the sample's parts come from, each once, in field order."""
        return tuple(dict.fromkeys(p.path for p in self.parts))


@dataclass
class FieldScan(Scan):
    """A scanned source of samples with fields: :class:`Scan` plus the fields, in record
    order, and what the manifest records of the source (``categories`` of COCO, ...)."""

    fields: list[FieldSpec] = field(default_factory=list)
    recorded: dict[str, Any] = field(default_factory=dict)
    source_kind: str = ""
    inputs: list[str] = field(default_factory=list)  # files every sample depends on (COCO JSON)

    def describe(self) -> dict[str, Any]:
        return {"root": self.root, "files": len(self.samples), "bytes": self.total_bytes}


def why_none(skipped: list[SkippedInput], shown: int = 3) -> str:
    """Why a source gave no sample: how many inputs were skipped, by reason (quoted names and
    numbers folded), the commonest first, each with its first example."""
    if not skipped:
        return "it lists none"
    groups: dict[str, list[SkippedInput]] = {}
    for item in skipped:
        groups.setdefault(_FOLD.sub("…", item.reason), []).append(item)
    ranked = sorted(groups.values(), key=len, reverse=True)
    parts = [f"{len(g)} × {g[0].reason} ({g[0].path})" for g in ranked[:shown]]
    more = f"; {len(ranked) - shown} other reasons" if len(ranked) > shown else ""
    return f"{len(skipped)} skipped: " + "; ".join(parts) + more


_FOLD = re.compile(r"'[^']*'|\"[^\"]*\"|\d+")


def declare_fields(
    names: set[str] | list[str], where: str, kinds: dict[str, str] | None = None
) -> list[FieldSpec]:
    """The fields of ``names`` (each checked), sorted by name, kinds from their names unless
    ``kinds`` says otherwise.

    Raises:
        SourceError: a name is not plain, or there are more than MAX_FIELDS.
    """
    if len(names) > MAX_FIELDS:
        raise SourceError(
            f"{where} has {len(names)} distinct field names, more than {MAX_FIELDS}: is it a "
            "set of samples (files sharing a key: 0001.jpg, 0001.txt)?"
        )
    kinds = kinds or {}
    return [
        FieldSpec(check_field_name(n, where), kinds.get(n) or field_kind(n)) for n in sorted(names)
    ]


def keep_required(
    samples: list[FieldSample],
    required: list[str],
    fields: list[FieldSpec],
    skipped: list[SkippedInput],
    where: str,
) -> list[FieldSample]:
    """``samples`` that have every field of ``required``; the others skipped with the missing
    field named.

    Raises:
        SourceError: a required field that no sample of the source has.
    """
    names = {f.name for f in fields}
    unknown = [r for r in required if r not in names]
    if unknown:
        raise SourceError(
            f"--require {unknown[0]}: no sample of {where} has a field {unknown[0]!r}; its "
            f"fields are {', '.join(sorted(names)) or '(none)'}"
        )
    if not required:
        return samples
    out = []
    for sample in samples:
        have = {p.field for p in sample.parts}
        missing = [r for r in required if r not in have]
        if missing:
            skipped.append(SkippedInput(sample.path, f"no {missing[0]!r} field (--require)"))
        else:
            out.append(sample)
    return out


def fold_case_duplicates(
    samples: list[FieldSample], skipped: list[SkippedInput]
) -> list[FieldSample]:
    """``samples`` without keys that repeat, exactly or differing only by case (two samples
    that would be one on a case-insensitive disk, or a mistake): every one of them is skipped
    with its reason, none is kept in place of another."""
    seen: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        seen.setdefault(sample.key.casefold(), []).append(i)
    bad = {i for group in seen.values() if len(group) > 1 for i in group}
    if not bad:
        return samples
    out = []
    for i, sample in enumerate(samples):
        if i not in bad:
            out.append(sample)
            continue
        others = [samples[j].path for j in seen[sample.key.casefold()] if j != i]
        same = any(samples[j].key == sample.key for j in seen[sample.key.casefold()] if j != i)
        what = "the same key" if same else "a key that differs only by case"
        skipped.append(SkippedInput(sample.path, f"{what} as {others[0]!r}: keys must be unique"))
    return out


def sample_of(
    key: str, where: str, parts: list[Part], skipped: list[SkippedInput], what: str = "files"
) -> FieldSample | None:
    """The sample of ``parts`` (in field order), or None, skipped with its reason, when two of
    them are one field (``0001.jpg`` and ``0001.JPG``)."""
    names = [p.field for p in parts]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        skipped.append(SkippedInput(where, f"two {what} for field {twice[0]!r}"))
        return None
    total = sum(p.size for p in parts)
    return FieldSample(key, where, total, tuple(sorted(parts, key=lambda p: p.field)))


def finish_scan(
    scan: FieldScan,
    samples: list[FieldSample],
    required: list[str] | None,
    where: str,
    kinds: dict[str, str] | None = None,
) -> FieldScan:
    """``scan`` with its samples: keys that repeat or differ only by case skipped, the fields
    declared (kinds from their names unless ``kinds`` says), samples without a ``required``
    field skipped.

    Raises:
        SourceError: more than MAX_FIELDS fields, a field name that is not plain, or a
            ``required`` field no sample has.
    """
    samples = fold_case_duplicates(samples, scan.skipped)
    used = {p.field for s in samples for p in s.parts}
    scan.fields = declare_fields(used, where, kinds)
    kept = keep_required(samples, list(required or []), scan.fields, scan.skipped, where)
    scan.samples = kept  # type: ignore[assignment]  # a Scan of FieldSamples
    return scan
