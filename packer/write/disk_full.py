"""The error for a full disk, with an estimate of how much more the conversion needs.

The remaining need is not the source's size minus what was written: a format that transcodes
(BMP stores pixels, ~10× its JPEG inputs) writes more than it reads, and the tables and manifest
come last. So the data still to write is estimated at the ratio of bytes written per input
byte in the finished shards, plus the tables not yet written; the message says it is an estimate
and how it was made.

Before a conversion starts, :func:`check_room` estimates the whole output from the plan (per
format: LMDB rounds each value above half a page up to whole overflow pages; NPY and HDF5 store
the inputs' bytes; BMP stores pixels, read from a sample of the inputs' headers; every file
rounds up to the destination's block) and refuses a destination without that much free space.
Measured within ±20 % of the space a conversion takes (``tests/test_first_day2_disk_space.py``).
A write-time resize or re-encode (``--max-side``, ``--size``, ...) cannot be estimated: no
pre-flight check then, only the error on a full disk.

An upload that streams its shards (:func:`streamed`, :mod:`packer.upload.stream`) holds only a
few of them: its full disk asks for ``--staging-limit`` plus two shards and the tables
(:func:`streaming_need`), not the whole output.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from packer.core.manifest import INDEX_NAME, KEYS_NAME, MANIFEST_NAME, RECORDS_NAME
from packer.core.sizes import format_size
from packer.core.tablefile import temp_name
from packer.errors import DestinationError
from packer.write.resume import Progress

__all__ = ["check_room", "disk_full_error", "estimate_need", "estimate_output", "streamed"]

_RESIZING = ("quality", "max_side", "short_side", "reencode", "size")
_PAGE = 4096  # LMDB's page (the OS page size on Linux x86/arm)
_HEADERS_READ = 32  # BMP: image headers read to tell the pixels-per-input-byte ratio

_TABLES = frozenset(  # every name a table or the manifest has, finished or being written
    n for t in (INDEX_NAME, RECORDS_NAME, KEYS_NAME, MANIFEST_NAME) for n in (t, temp_name(t))
)


def _written(partial: Path) -> tuple[int, int]:
    """Bytes on disk in ``partial``: (data files, tables and manifest); progress not counted."""
    data = tables = 0
    for root, dirs, files in os.walk(partial):
        if Path(root) == partial:
            dirs[:] = [d for d in dirs if d != "_progress"]
        for name in files:
            try:
                size = os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if Path(root) == partial and name in _TABLES:
                tables += size
            else:
                data += size
    return data, tables


# (limit, shard size) of the upload streaming this thread's conversion (packer.upload.stream)
_STREAMED: ContextVar[tuple[int, int] | None] = ContextVar("packer_streamed", default=None)


@contextmanager
def streamed(limit: int, shard_size: int) -> Iterator[None]:
    """Within it, the conversion's shards leave as they are checkpointed (an upload's staging:
    ``limit`` bytes of finished shards may wait for their upload, ``shard_size`` the plan's), so
    a full disk asks for what streaming holds (:func:`streaming_need`), not the whole output."""
    token = _STREAMED.set((limit, shard_size))
    try:
        yield
    finally:
        _STREAMED.reset(token)


def _held(partial: Path) -> int:
    """Bytes of disk blocks the files in ``partial`` hold (a released copy, all holes, none)."""
    held = 0
    for root, _, names in os.walk(partial):
        for name in names:
            try:
                held += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return held


def streaming_need(
    partial: Path, source: Any, stream: tuple[int, int], whole: int | None, block: int
) -> tuple[int, str]:
    """How many more bytes a streamed conversion into ``partial`` needs (``stream``: the bytes
    of finished shards that may wait for their upload, the shard size): those shards (at least
    one), the shard being written and the one being finished (a shard passes its size by up to
    one input), the checkpoints every shard leaves until the end (four files of a
    ``block`` or more each, holding its share of the tables), the tables and the journal; never
    more than the ``whole`` output (where estimated) with its checkpoints; less the blocks its
    files hold now."""
    limit, shard_size = stream
    n = len(source.samples)
    tables = 40 * n + sum(len(os.fsencode(s.key)) + 1 for s in source.samples) + 4096
    data = whole if whole is not None else int(source.total_bytes)
    largest = max((int(getattr(s, "size", 0)) for s in source.samples), default=0)
    shard = min(shard_size + largest, max(data, 1))
    checkpoints = -(-data // max(shard_size, 1)) * 4 * block + tables  # four files a shard
    peak = max(limit, shard) + 2 * shard + checkpoints + tables + 8 * block
    if whole is not None:
        peak = min(peak, whole + checkpoints + 8 * block)
    held = _held(partial) if partial.is_dir() else 0
    return max(peak - held, 0), (
        f"an estimate for an upload that streams its shards: {format_size(limit)} of shards "
        f"waiting (--staging-limit), two of up to {format_size(shard)} being written and "
        f"finished, {format_size(checkpoints + tables)} of checkpoints and tables, less the "
        f"{format_size(held)} staged now"
    )


def estimate_need(
    partial: Path, source: Any, fmt: str | None = None, options: dict[str, Any] | None = None
) -> tuple[int, str]:
    """How many more bytes ``partial`` needs to be complete, and how that was estimated: the
    data still to write at the ratio of bytes written per input byte in the finished shards
    (BMP writes pixels: ~10× its JPEG inputs), plus the tables (16 bytes a sample, 24 a
    record, the keys, ~4 kB of manifest) not yet written. Without a finished shard, the source's
    size stands for the data (said so: a transcoding format needs more). Within
    :func:`streamed` (an upload's staging), what streaming holds: :func:`streaming_need`."""
    try:
        block = os.statvfs(partial.parent).f_frsize or 4096
    except OSError:
        block = 4096
    whole = None if fmt is None else estimate_output(fmt, source, options or {}, block)
    if (stream := _STREAMED.get()) is not None:
        return streaming_need(partial, source, stream, whole, block)
    if whole is not None:
        written = sum(_written(partial)) if partial.is_dir() else 0
        return max(whole - written, 0), (
            f"an estimate for {fmt} from the source's {len(source.samples)} input(s), less "
            f"the {format_size(written)} already written"
        )
    done = Progress(partial).finished()
    keys = {k for c in done for k in c.keys}
    dropped = {s["path"] for c in done for s in c.skipped}
    inputs_done = sum(s.size for s in source.samples if s.key in keys or s.path in dropped)
    records = sum(len(c.records) for c in done)
    per_sample = records / len(keys) if keys else 1.0
    n = len(source.samples)
    key_bytes = sum(len(os.fsencode(s.key)) + 1 for s in source.samples)
    data, tables_written = _written(partial)
    manifest = 4096 + sum(len(c) + 8 for c in source.classes) + 256 * len(source.skipped)
    tables = 16 * n + int(24 * per_sample * n) + key_bytes + manifest
    tables_left = max(tables - tables_written, 0)
    if inputs_done == 0:
        need = max(source.total_bytes - data, 0) + tables_left
        return need, (
            "an estimate from the inputs' size: no shard is finished yet, and a format that "
            "transcodes (bmp, npy with --size) writes more than it reads"
        )
    ratio = data / inputs_done
    need = max(int(ratio * source.total_bytes) - data, 0) + tables_left
    return need, (
        f"an estimate: {ratio:.2f} bytes written per input byte so far, plus "
        f"{format_size(tables_left)} of tables"
    )


def _lmdb_value(size: int) -> int:
    """Bytes an LMDB value takes: above half a page, whole overflow pages; else a node."""
    if size + 16 > _PAGE // 2:
        return -(-(size + 16) // _PAGE) * _PAGE
    return size + 24


def _bmp_ratio(samples: list[Any]) -> float | None:
    """BMP bytes per input byte over up to ``_HEADERS_READ`` inputs spread over the source
    (their headers only), or None when none can be read."""
    from PIL import Image

    step = max(len(samples) // _HEADERS_READ, 1)
    pixels = inputs = 0
    for sample in samples[::step][:_HEADERS_READ]:
        try:
            with Image.open(sample.path) as image:
                width, height = image.size
        except Exception:  # noqa: BLE001 - any unreadable header (a bomb, a truncation) is skipped
            continue
        pixels += 54 + (width * 3 + 3) // 4 * 4 * height
        inputs += max(int(sample.size), 1)
    return pixels / inputs if inputs else None


def estimate_output(fmt: str, source: Any, options: dict[str, Any], block: int) -> int | None:
    """The bytes a conversion of ``source`` into format ``fmt`` will take on a file system of
    ``block``-byte blocks (see the module docstring), or None where it cannot be told."""
    if source.kind not in ("image", "fields") or any(options.get(k) for k in _RESIZING):
        return None
    samples = list(source.samples)
    sizes = [int(getattr(s, "size", 0)) for s in samples]
    n = len(samples)
    tables = 16 * n + 24 * n + sum(len(os.fsencode(s.key)) + 1 for s in samples) + 4096
    tables += 4 * block  # the tables' and manifest's files round up to a block each
    if fmt == "lmdb":
        return sum(_lmdb_value(size) for size in sizes) + 24 * n + 8 * _PAGE + tables
    if fmt in ("npy", "hdf5"):
        return sum(sizes) + 4 * block + tables
    if fmt == "bmp":
        ratio = _bmp_ratio(samples) if source.kind == "image" else None
        if ratio is None:
            return None
        per_file = [-(-int(size * ratio) // block) * block for size in sizes]
        return sum(per_file) + tables
    return None


def check_room(
    partial: Path, fmt: str, source: Any, options: dict[str, Any], resume: bool = False
) -> None:
    """Refuse a conversion the destination cannot hold (before any work): estimated from the
    plan (:func:`estimate_output`) less what ``partial`` already holds when resuming it (else
    it is removed first, and its space counts as free)."""
    try:
        stat = os.statvfs(partial.parent)
    except OSError:
        return
    need = estimate_output(fmt, source, options, stat.f_frsize or 4096)
    if need is None:
        return
    data, tables = _written(partial) if partial.is_dir() else (0, 0)
    free = stat.f_bavail * stat.f_frsize
    if resume:
        need = max(need - data - tables, 0)
    else:
        free += data + tables
    if need > free:
        raise DestinationError(
            f"not enough space for {str(partial.parent / partial.stem)!r}: about "
            f"{format_size(need)} is needed (an estimate for {fmt} from the source's "
            f"{len(source.samples)} input(s)) and {format_size(free)} is free on "
            f"{str(partial.parent)!r}. Free space or choose another destination; an interrupted "
            "conversion continues with --resume"
        )


RESUME_ADVICE = "The finished shards are kept: free space, then run the same command with --resume"


def disk_full_error(
    partial: Path,
    source: Any,
    fmt: str | None = None,
    options: dict[str, Any] | None = None,
    advice: str = RESUME_ADVICE,
) -> DestinationError:
    """The error for a full disk: how much more is needed (an estimate, said so), what is free,
    how to go on (``advice``: a ``packer.Writer``, which does not resume, says its own)."""
    try:
        free = shutil.disk_usage(partial.parent).free
    except OSError:
        free = 0
    try:
        need, how = estimate_need(partial, source, fmt, options)
    except OSError:  # a resume's checkpoints unreadable: the whole estimate still stands
        need, how = estimate_output(fmt or "", source, options or {}, 4096) or 0, "an estimate"
    return DestinationError(
        f"disk full while writing {str(partial)!r}: about {format_size(need)} more is needed "
        f"({how}) and {format_size(free)} is free. {advice}"
    )
