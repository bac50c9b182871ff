"""WebDataset tar shards as a source: each member a field of the sample its key names.

A source is one ``.tar``, a folder of ``.tar`` files, or a brace pattern as WebDataset writes
it (``shards/{000000..000099}.tar``, ``{train,val}-{0..3}.tar``). A member's key is its path
without everything from the first dot of its file name, the rest (lower-cased) its field:
``0001.jpg`` and ``0001.txt`` are sample ``0001``'s ``jpg`` and ``txt``. Members are found by
their headers alone; the loader reads each one's bytes by range (no extraction, no copy).

Skipped, each with its reason: a sample one of whose members is absolute, climbs out of its
tar (``../x``), is a link, sparse or not a regular file, has a name that is not UTF-8 or not a
plain field (the sample whole, never kept without that field); a sample with two members for
one field; keys repeated across shards or differing only by case; the sample a truncated tar
cuts (and the tar named as truncated); in a folder of shards, a ``.tar`` linked outside the
folder (unless ``follow_links``). How a damaged tar's listing ends: :mod:`tar_headers`. A
compressed tar is refused: its members cannot be read by range.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packer.errors import InputFileError, SourceError
from packer.source.images import SkippedInput
from packer.source.links import open_source_fd
from packer.source.samples import (
    FieldSample,
    FieldScan,
    Part,
    declare_fields,
    finish_scan,
    sample_of,
)
from packer.source.tar_headers import Listing, Member, list_fd, list_tar

__all__ = [
    "HTTP_VALIDATORS",
    "expand_braces",
    "looks_tars",
    "scan_tars",
    "shard_tag",
    "tar_paths",
    "unique_names",
]

_RANGE = re.compile(r"^(\d+)\.\.(\d+)$")
MAX_SHARDS = 1_000_000
COMPRESSED = (".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar.zst")
HTTP_VALIDATORS = ("ETag", "Content-MD5", "Digest", "Last-Modified")  # a shard's tag, in order


def _closing(pattern: str, start: int) -> int:
    """The index of the ``}`` that closes the ``{`` at ``start``, or -1."""
    depth = 0
    for i in range(start, len(pattern)):
        if pattern[i] == "{":
            depth += 1
        elif pattern[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _alternatives(body: str) -> list[str] | None:
    """``body`` split at its top-level commas (nested braces kept whole), or None without one."""
    parts, depth, last = [], 0, 0
    for i, ch in enumerate(body):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            parts.append(body[last:i])
            last = i + 1
    return parts + [body[last:]] if parts else None


def _range(pattern: str, body: str) -> list[str] | None:
    """The names of a numeric range ``lo..hi`` (zero-padded as bash pads them), or None."""
    bounds = _RANGE.match(body)
    if bounds is None:
        return None
    first, last = bounds.groups()
    lo, hi = int(first), int(last)
    if hi < lo or hi - lo >= MAX_SHARDS:
        raise SourceError(f"{pattern!r}: range {{{body}}} is empty or over {MAX_SHARDS:,}")
    padded = any(len(b) > 1 and b.startswith("0") for b in (first, last))
    width = max(len(first), len(last)) if padded else 0
    return [str(i).zfill(width) for i in range(lo, hi + 1)]


def _first_group(pattern: str) -> tuple[int, int, list[str]] | None:
    """The first brace group that expands, as bash finds it: ``(start, end, choices)``. A
    ``{`` without its ``}``, or whose body has no top-level comma and is no range, is text."""
    start = pattern.find("{")
    while start >= 0:
        end = _closing(pattern, start)
        if end > 0:
            body = pattern[start + 1 : end]
            choices = _alternatives(body)
            if choices is None:
                choices = _range(pattern, body)
            if choices is not None:
                return start, end, choices
        start = pattern.find("{", start + 1)
    return None


def expand_braces(pattern: str) -> list[str]:
    """Every name a brace pattern stands for, in bash's order: ``{a,b}`` and nested groups
    (``x{a,{b,c}}y``: ``xay xby xcy``), ``{0..3}`` (zero-padded as bash pads: ``{000..002}``);
    a brace that expands nothing is text, and a pattern without braces is itself.

    Raises:
        SourceError: a range that runs backwards or expands to over a million names.
    """
    group = _first_group(pattern)
    if group is None:
        return [pattern]
    start, end, choices = group
    head, tail = pattern[:start], pattern[end + 1 :]
    out: list[str] = []
    for choice in choices:
        out += expand_braces(head + choice + tail)
        if len(out) > MAX_SHARDS:
            raise SourceError(f"{pattern!r} expands to over {MAX_SHARDS:,} names")
    return out


def unique_names(names: list[str], same: Callable[[str], str] = str) -> list[str]:
    """``names`` with each later repeat dropped (``same`` gives what makes two names one
    shard): a pattern naming a shard twice (``{a,a,b}``) reads it once, never twice with
    every sample of the second read lost as a duplicate key."""
    seen: set[str] = set()
    out = []
    for name in names:
        if same(name) not in seen:
            seen.add(same(name))
            out.append(name)
    return out


def shard_tag(remote: Any, name: str, size: int) -> str | None:
    """What tells tar shard ``name`` of ``remote`` (a :class:`packer.remote.storage.RemoteFolder`)
    from another object of the same size, for the fetch cache: its listed ETag; for HTTP(S),
    one HEAD's first validator (``"Last-Modified: ..."``, kept by fsspec's ``info()``), else
    the digest of its bytes (``"xxh3: ..."``). A shard replaced at the server is then fetched anew, and the
    new copy's time changes the ``--resume`` fingerprint.

    Raises:
        PackerError: the server cannot be reached (after retries).
    """
    tag: str | None = remote.identity.get(name, (size, None))[1]
    if tag is not None or remote.url.split("://", 1)[0] not in ("http", "https"):
        return tag
    url, fs = remote.url_of(name), remote.fs()
    info = remote.call(url, lambda: fs.info(url, **remote.limit(0)))
    found = [f"{field}: {info[field]}" for field in HTTP_VALIDATORS if info.get(field)]
    return found[0] if found else _content_tag(remote, name, size)


def _content_tag(remote: Any, name: str, size: int, chunk: int = 8 << 20) -> str:
    """The xxh3_64 of an object's bytes, read by ranged GETs: the tag of a shard whose server
    gives no validator (it costs one read of the shard; a copy of the same bytes is kept)."""
    import xxhash

    digest = xxhash.xxh3_64()
    for start in range(0, size, chunk):
        digest.update(remote.read_runs([name], [start], [min(size, start + chunk)])[0])
    return f"xxh3: {digest.hexdigest()}"


def looks_tars(src: str | os.PathLike[str]) -> bool:
    """Whether ``src`` names tar shards: a ``.tar`` name (or pattern of them), or a folder whose
    visible entries are all ``.tar`` files."""
    text = os.fspath(src)
    if text.lower().endswith(".tar") or text.lower().endswith(COMPRESSED):
        return True
    path = Path(text)
    if not path.is_dir():
        return False
    try:
        names = [n for n in os.listdir(path) if not n.startswith(".")]
    except OSError:
        return False
    return bool(names) and all(n.lower().endswith(".tar") for n in names)


def tar_paths(src: str | os.PathLike[str]) -> list[str]:
    """The shard files of ``src`` (a tar, a brace pattern of them, a folder of them), in order.

    Raises:
        SourceError: a compressed tar, a named shard that is missing, or no shard at all.
    """
    text = os.fspath(src)
    if Path(text).is_dir():
        paths = sorted(os.path.join(text, n) for n in os.listdir(text) if n.endswith(".tar"))
    else:
        paths = unique_names(expand_braces(text), os.path.realpath)
    for path in paths:
        if path.lower().endswith(COMPRESSED):
            raise SourceError(
                f"{path!r} is a compressed tar: its members cannot be read by range; decompress "
                "it first (gunzip/unzstd) or convert from the extracted files"
            )
        if not os.path.isfile(path):
            raise SourceError(f"shard {path!r} does not exist (from {text!r})")
    if not paths:
        raise SourceError(f"{text!r} holds no .tar shard")
    return paths


def _member_problem(member: Member) -> str | None:
    """Why ``member`` cannot be a field, or None."""
    name = member.name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "member name is not UTF-8"
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        return "absolute member name"
    if ".." in name.split("/"):
        return "member outside its tar's folder (..)"
    if member.kind in ("sym", "link"):
        return "linked member (symlink or hard link)"
    if member.problem:
        return member.problem
    if member.kind != "file":
        return "not a regular file"
    return None


def _key_field(name: str) -> tuple[str, str | None]:
    """A member's sample key and field (None: a name without a field)."""
    folder, _, base = name.rpartition("/")
    dot = base.find(".", 1)
    key = (folder + "/" if folder else "") + (base[:dot] if dot > 0 else base)
    return key, base[dot + 1 :].lower() if dot > 0 else None


def _open_listing(path: str, root: str | None, follow_links: bool) -> Listing:
    """The listing of tar ``path``; under a folder's real ``root`` opened by
    :func:`packer.source.links.open_source_fd` (a link leaving it refused unless
    ``follow_links``, checked on the opened descriptor)."""
    if root is None:
        return list_tar(path)
    fd = open_source_fd(root, path, follow_links)
    try:
        return list_fd(fd)
    finally:
        os.close(fd)


def _listing(path: str, scan: FieldScan, root: str | None, follow: bool) -> Listing | None:
    """The listing of one tar, or None (the tar skipped with its reason)."""
    try:
        listing = _open_listing(path, root, follow)
    except InputFileError as exc:
        scan.skipped.append(SkippedInput(path, str(exc)))
        return None
    except OSError as exc:
        scan.skipped.append(SkippedInput(path, f"cannot read: {exc.strerror or exc}"))
        return None
    except Exception as exc:  # noqa: BLE001 - one shard's problem, whatever its type
        scan.skipped.append(SkippedInput(path, f"unreadable tar: {type(exc).__name__}: {exc}"))
        return None
    if listing.stopped is not None and not listing.members:
        scan.skipped.append(SkippedInput(path, f"not a readable tar: {listing.stopped}"))
        return None
    return listing


def _members(
    path: str, listing: Listing, scan: FieldScan
) -> tuple[list[tuple[str, Part]], dict[str, str], str]:
    """``[(key, part)]`` of one tar's usable members, the keys whose sample is skipped whole
    (one member unusable) with the reason, and the last key (the one a truncation cuts)."""
    found: list[tuple[str, Part]] = []
    bad: dict[str, str] = {}
    fields: set[str] = set()  # the field names already checked
    last_key = ""
    for member in listing.members:
        if member.kind == "dir":
            continue
        key, field = _key_field(member.name)
        last_key = key
        problem = _member_problem(member)
        if field is None:
            if problem is None:
                scan.ignored += 1
            else:
                scan.skipped.append(SkippedInput(f"{path}:{member.name}", problem))
            continue
        if problem is None and field not in fields:
            try:
                declare_fields([field], repr(f"{path}:{member.name}"))
                fields.add(field)
            except SourceError as exc:
                problem = str(exc)
        if problem is not None:
            bad.setdefault(key, f"field {field!r} ({member.name}): {problem}")
            continue
        found.append((key, Part(field, path, member.size, offset=member.offset)))
    return found, bad, last_key


def _samples(path: str, scan: FieldScan, root: str | None, follow: bool) -> list[FieldSample]:
    """The samples of one tar, in the order of their first member: a sample with an unusable
    member skipped whole, the sample a truncation cuts skipped, an early end listed."""
    listing = _listing(path, scan, root, follow)
    if listing is None:
        return []
    members, bad, last_key = _members(path, listing, scan)
    cut = last_key if listing.cut else ""  # after a damaged header, what precedes is whole
    if listing.stopped is not None:
        lost = f": sample {cut!r} (it may lack later fields) and anything after it lost"
        scan.skipped.append(SkippedInput(path, listing.stopped + (lost if cut else "")))
    by_key: dict[str, list[Part]] = {}
    for key, part in members:
        if key != cut and key not in bad:
            by_key.setdefault(key, []).append(part)
    for key, reason in bad.items():
        if key != cut:
            scan.skipped.append(SkippedInput(f"{path}:{key}.*", reason))
    found = (
        sample_of(k, f"{path}:{k}.*", parts, scan.skipped, "members") for k, parts in by_key.items()
    )
    return [sample for sample in found if sample is not None]


def scan_tars(
    src: str | os.PathLike[str], required: list[str] | None = None, follow_links: bool = False
) -> FieldScan:
    """Scan WebDataset tar shards into an ordered :class:`FieldScan` (headers only). In a
    folder of shards, a ``.tar`` linked to a file outside the folder is skipped with its reason
    unless ``follow_links`` (a tar or pattern named by the caller is read wherever it is).

    Raises:
        SourceError: no shard, a missing or compressed shard, no sample in any shard, more than
            ``MAX_FIELDS`` field names, or a ``required`` field no sample has.
    """
    paths = tar_paths(src)
    text = os.fspath(src)
    root = str(Path(paths[0]).parent.resolve())
    scan = FieldScan(root=root, kind="fields", classes=[], samples=[])
    scan.source_kind = "tars"
    samples: list[FieldSample] = []
    folder = os.path.realpath(text) if Path(text).is_dir() else None
    for path in paths:
        samples += _samples(path, scan, folder, follow_links)
    if not samples:
        raise SourceError(
            f"{text!r} holds no sample (tar members sharing a key: 0001.jpg, 0001.txt)"
        )
    return finish_scan(scan, samples, required, repr(text))
