"""Check a packed dataset against its manifest: shard checksums, per-sample checksums, decoding.

Returns a report; never prints. ``packer verify`` echoes it and exits non-zero on any problem.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from packer.core.contained import check_relative, open_beneath, open_folder
from packer.core.cpus import available_cpus
from packer.core.fields import ABSENT, record_matches
from packer.core.manifest import (
    INDEX_NAME,
    KEYS_NAME,
    RECORDS_NAME,
    Manifest,
    load_manifest,
)
from packer.core.tablefile import fd_checksum
from packer.decode.outputs import decode
from packer.decode.pixels import pixels_output
from packer.decode.values import decode_value
from packer.errors import PackerError
from packer.read.store import Packed, open_packed
from packer.read.verify_report import Problem, VerifyReport
from packer.remote.opener import CacheOptions, Check, cache_check, url_manifest
from packer.remote.storage import RemoteFolder, is_url, join_url

__all__ = ["Problem", "VerifyReport", "verify"]


def _check_named(
    manifest: Manifest, report: VerifyReport, check: Callable[[str, str, int | None], str | None]
) -> tuple[set[str], set[str]]:
    """``check(name, xxh3, size)`` of every data file and table the manifest names (size None
    for a table); return (unreadable files, corrupt files)."""
    bad: set[str] = set()
    corrupt: set[str] = set()
    named: list[tuple[str, str, int | None]] = [
        (s.name, s.xxh3_64, s.bytes) for s in manifest.shards
    ]
    named += [(name, digest, None) for name, digest in manifest.files.items()]
    for name, digest, size in named:
        report.files_checked += 1
        found = check(name, digest, size)
        if found is not None:
            report.problems.append(Problem(name, found))
            (corrupt if found == _DIFFERS else bad).add(name)
    return bad, corrupt


def _check_files(root: Path, manifest: Manifest, report: VerifyReport) -> tuple[set[str], set[str]]:
    """Check every file's size and checksum, each opened once beneath the dataset folder (no
    link, never a FIFO: ``packer.core.contained``); return (unreadable files, corrupt files)."""
    folder = open_folder(root)
    try:
        return _check_named(manifest, report, functools.partial(_check_file, root, folder))
    finally:
        os.close(folder)


def _check_object(folder: RemoteFolder, name: str, digest: str, size: int | None) -> str | None:
    """What is wrong with object ``name`` at ``folder``'s URL (streamed through xxh3), or None."""
    try:
        found_size, found = folder.stream_checksum(name)
    except PackerError as exc:
        return f"cannot be read: {exc}"
    if size is not None and found_size != size:
        return f"{found_size} bytes, manifest records {size}"
    return _DIFFERS if found != digest else None


_DIFFERS = "checksum differs from the manifest"


def _check_file(root: Path, folder: int, name: str, digest: str, size: int | None) -> str | None:
    """What is wrong with file ``name`` of the dataset, or None."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return "missing"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a symlink, FIFO, device?)"
    if size is not None and st.st_size != size:
        return f"{st.st_size} bytes, manifest records {size}"
    try:  # the file hashed is the file opened: a FIFO swapped in since the stat never blocks
        fd = open_beneath(folder, name, root)
    except PackerError as exc:
        return str(exc)
    try:
        digest_found = fd_checksum(fd)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or exc}"
    finally:
        os.close(fd)
    return _DIFFERS if digest_found != digest else None


_FOREIGN = "a FIFO, device or socket where only folders and regular files belong"


def _odd_entries(folder: Path, relative: str, recurse: bool) -> list[Problem]:
    """A finding for every symbolic link and every entry that is neither a folder nor a
    regular file under ``folder`` (links are never followed; ``recurse`` into sub-folders)."""
    found: list[Problem] = []
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        return [Problem(relative or ".", f"cannot be listed: {exc.strerror or exc}")]
    for entry in entries:
        name = f"{relative}{entry.name}"
        if entry.is_symlink():
            target = os.readlink(entry.path)
            found.append(
                Problem(name, f"a symbolic link (to {target!r}) inside the dataset: never followed")
            )
        elif entry.is_dir(follow_symlinks=False):
            if recurse:
                found += _odd_entries(Path(entry.path), name + "/", recurse)
        elif not entry.is_file(follow_symlinks=False):
            found.append(Problem(name, _FOREIGN))
    return found


def _verify_splits(
    root: Path | str,
    manifest: Manifest,
    full: bool,
    progress: bool,
    workers: int,
    options: dict[str, Any] | None = None,
    cache: CacheOptions | None = None,
) -> VerifyReport:
    """Each split is a complete output inside ``root`` (a folder or a URL): a plain folder
    name, a real folder."""
    report = VerifyReport(root)  # type: ignore[arg-type]  # a URL stays a str
    if isinstance(root, Path):
        report.problems += _odd_entries(root, "", recurse=False)
    for split in manifest.opts.splits:
        try:
            if "/" in check_relative(split, "split name"):
                raise PackerError(f"split name {split!r} is not a plain folder name")
        except PackerError as exc:
            report.problems.append(Problem(repr(split), f"{exc}; not verified"))
            continue
        if isinstance(root, Path):
            if (root / split).is_symlink():
                continue  # reported by _odd_entries above, never followed
            part = verify(root / split, full, progress, workers)
        else:
            given = (cache or CacheOptions()).given_as()
            part = verify(join_url(root, split), full, progress, workers, options, **given)
        report.files_checked += part.files_checked
        report.samples_checked += part.samples_checked
        report.decoded += part.decoded
        report.problems += [Problem(f"{split}/{p.where}", p.what) for p in part.problems]
    return report


def _where(packed: Packed, sample: int, record: int, keys: Sequence[str]) -> str:
    file = int(packed.reader.file[record])
    shard = packed.reader.shard_names[file] if packed.reader.layout == "shards" else "file"
    if packed.manifest.kind == "video":
        return f"{shard} video {keys[sample]!r} frame {record - int(packed.first[sample])}"
    return f"{shard} sample {keys[sample]!r}"


def _check_sample(
    packed: Packed, sample: int, keys: Sequence[str], checksums: np.ndarray, report: VerifyReport
) -> list[tuple[str, bytes, str]]:
    """Check one sample's records against their checksums; return the sound ones' bytes with
    their kind (``image``, or a field's kind; absent fields left out)."""
    fields = packed.manifest.opts.fields
    first, count = int(packed.first[sample]), int(packed.counts[sample])
    records = np.arange(first, first + count)
    try:
        stored = packed.reader.read_many(records)
    except Exception as exc:  # any library's error on damaged data is a finding, never a crash
        report.problems.append(Problem(_where(packed, sample, first, keys), f"cannot read: {exc}"))
        return []
    report.samples_checked += 1
    sound = []
    for record, data in zip(records.tolist(), stored):
        where = _where(packed, sample, record, keys)
        field = fields[record - first] if fields else None
        if field is not None:
            where = f"{where} field {field.name!r}"
        digest = int(checksums[record])
        if not record_matches(data, digest):
            report.problems.append(Problem(where, "stored bytes differ from their checksum"))
        elif field is None:
            sound.append((where, data, "image"))
        elif digest != ABSENT:
            sound.append((where, data, field.kind))
    return sound


def _decodes(item: tuple[str, bytes, str], pixels: tuple[int, ...] | None = None) -> Problem | None:
    try:
        if pixels is not None:
            pixels_output(item[1], pixels, "numpy")
        elif item[2] != "image":
            decode_value(item[1], item[2], "numpy")
        else:
            decode(item[1], "numpy")
    except Exception as exc:  # Pillow's DecompressionBombError is no OSError: catch them all
        return Problem(item[0], f"does not decode: {exc}")
    return None


def _skip_bad_shards(
    packed: Packed, bad: set[str], keys: Sequence[str], report: VerifyReport
) -> np.ndarray:
    """One finding per broken shard naming the samples it holds; those samples are not read
    (a damaged LMDB page could crash the reading process)."""
    skip = np.zeros(len(packed.first), dtype=bool)
    if packed.reader.layout != "shards":
        return skip
    names = packed.reader.shard_names
    shard_of_sample = packed.reader.file[packed.first]
    for n, name in enumerate(names):
        if name in bad:
            held = np.flatnonzero(shard_of_sample == n)
            skip[held] = True
            shown = ", ".join(repr(keys[int(i)]) for i in held[:3])
            more = f" and {len(held) - 3} more" if len(held) > 3 else ""
            report.problems.append(
                Problem(name, f"its {len(held)} sample(s) were not read: {shown}{more}")
            )
    return skip


def _verify_url(
    url: str, full: bool, progress: bool, workers: int, options: Any, cache: CacheOptions
) -> VerifyReport:
    """``verify`` of a URL: every shard and table streamed and hashed (sizes and xxh3 against
    the manifest), then every record read by ranged GETs and checked against its checksum.
    Shards read through the node-local cache (LMDB; NPY/HDF5 with ``cache``) are downloaded
    into it and checked there instead (``store_remote.cache_check``): then warm."""
    manifest = url_manifest(url, options)
    if manifest.kind == "splits":
        return _verify_splits(url, manifest, full, progress, workers, options, cache)
    report = VerifyReport(url)  # type: ignore[arg-type]  # a URL stays a str
    folder = RemoteFolder(url, options)
    check: Check = functools.partial(_check_object, folder)
    cached = cache.wanted(manifest, url)
    if cached is not None and manifest.shards:
        check = cache_check(folder, cached, manifest, check, _DIFFERS)
    unreadable, corrupt = _check_named(manifest, report, check)
    if {INDEX_NAME, RECORDS_NAME, KEYS_NAME} & (unreadable | corrupt):
        return report
    try:
        packed = open_packed(url, check_files=False, storage_options=options, **cache.given_as())
        keys = packed.reader.keys
        len(keys)
    except PackerError as exc:
        report.problems.append(Problem("tables", str(exc)))
        return report
    if cached is None:  # an uncached RemoteReader: verify compares every record itself and
        packed.reader.checksum = None  # type: ignore[attr-defined]  # names the samples
    # a corrupt shard is never cached: its samples are skipped, as a corrupt LMDB shard's are
    bad_files = unreadable | (corrupt if manifest.format == "lmdb" or cached else set())
    return _check_samples(packed, keys, bad_files, full, progress, workers, report)


def verify(
    path: str | os.PathLike[str],
    full: bool = False,
    progress: bool = True,
    workers: int = 0,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
) -> VerifyReport:
    """Verify the packed dataset at ``path``; never raises on damaged data, reports it.

    Checks every data file's and table's xxh3 checksum and size against the manifest (a shard
    that fails is reported once, with the samples it holds, and not read further), then reads
    every record of every sample (every frame of a video) and compares its bytes' checksum with
    the record table, naming the shard and sample key of each mismatch. With ``full``, also
    decodes every record, on ``workers`` threads (default: the CPU count). A URL is read
    through ``storage_options`` (shards and tables streamed, records by ranged GETs); with
    ``cache_dir`` (or ``cache_limit``), and for LMDB always, its shards are downloaded into the
    node-local shard cache and checked there, so a verified dataset is then read warm.

    Raises:
        PackerError: storage or cache options for a local path; a cache limit below a shard.
    """
    cache = CacheOptions(cache_dir=cache_dir, cache_limit=cache_limit)
    if is_url(path):
        return _verify_url(str(path), full, progress, workers, storage_options, cache)
    if storage_options is not None or cache.given():
        what = "storage_options" if storage_options is not None else "the shard cache"
        raise PackerError(f"{what} is for a URL; {str(path)!r} is a local path")
    root = Path(path)
    manifest = load_manifest(root)
    report = VerifyReport(root)
    if manifest.kind == "splits":  # each split is a complete output: verify each
        return _verify_splits(root, manifest, full, progress, workers)
    report.problems += _odd_entries(root, "", recurse=True)
    try:
        names = {s.name for s in manifest.shards} | set(manifest.files)
        unsafe = sorted(n for n in names if "/" in n or n in (".", "..") or "\0" in n)
        if unsafe:
            report.problems.append(Problem(unsafe[0], "not a plain file name in the dataset"))
            return report
        unreadable, corrupt = _check_files(root, manifest, report)
        if {INDEX_NAME, RECORDS_NAME, KEYS_NAME} & (unreadable | corrupt):
            return report  # per-sample checks need sound tables
        # A corrupt LMDB page can crash the reading process: such a shard is not read. A
        # corrupt NPY/HDF5 shard is read by bounded slices, so its bad samples get named.
        bad_files = unreadable | (corrupt if manifest.format == "lmdb" else set())
        packed = open_packed(root, check_files=False)
        keys = packed.reader.keys
        len(keys)  # parses the lines: checks keys that name files (per-sample layouts)
    except PackerError as exc:
        report.problems.append(Problem("tables", str(exc)))
        return report
    return _check_samples(packed, keys, bad_files, full, progress, workers, report)


def _check_samples(
    packed: Packed,
    keys: Sequence[str],
    bad_files: set[str],
    full: bool,
    progress: bool,
    workers: int,
    report: VerifyReport,
) -> VerifyReport:
    """Every record of every sample not in a bad file against its checksum (decoded too
    with ``full``)."""
    manifest, checksums = packed.manifest, packed.checksums
    skip = _skip_bad_shards(packed, bad_files, keys, report)
    unit = "video" if manifest.kind == "video" else "sample"
    pool = ThreadPoolExecutor(workers or available_cpus()) if full else None
    pixels = manifest.opts.pixels
    try:
        for i in tqdm(range(manifest.num_samples), unit=unit, desc="verify", disable=not progress):
            if skip[i]:
                continue
            sound = _check_sample(packed, i, keys, checksums, report)
            if pool is not None and sound:
                found = list(pool.map(functools.partial(_decodes, pixels=pixels), sound))
                report.problems += [p for p in found if p is not None]
                report.decoded += sum(p is None for p in found)
    finally:
        if pool is not None:
            pool.shutdown()
        packed.reader.close()
    return report
