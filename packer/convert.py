"""Convert a source folder into a packed dataset: scan → parallel read/check → writer → manifest.

The output is built in ``DST.partial/`` and renamed to ``DST`` only once complete; the manifest
is written last, so its presence means the dataset is whole. Shard boundaries are planned from
the scanned file sizes before any byte is read, and samples are written in scan order, so the
output is byte-for-byte the same whatever the number of workers.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import numpy as np
from tqdm.auto import tqdm

from packer.check import CHECKS
from packer.errors import DestinationError, InputFileError, PackerError
from packer.formats import by_name, format_for
from packer.manifest import (
    INDEX_DTYPE,
    INDEX_NAME,
    KEYS_NAME,
    Manifest,
    write_index,
    write_keys,
    write_manifest,
)
from packer.pipeline import default_workers, load_in_order
from packer.sizes import format_size, parse_size
from packer.sources import Scan, SkippedInput, scan

__all__ = ["ConvertResult", "convert", "plan_shards"]

DEFAULT_SHARD_SIZE = 1 << 30


@dataclass
class ConvertResult:
    """What a conversion did: the manifest written and the numbers for the summary."""

    dst: Path
    manifest: Manifest
    seconds: float
    bytes_in: int
    bytes_out: int
    skipped: list[SkippedInput] = field(default_factory=list)

    def summary(self) -> str:
        """A few human-readable lines: counts, sizes, time, skipped inputs."""
        m = self.manifest
        rate = self.bytes_in / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"wrote {self.dst} ({m.format}): {m.num_samples} samples, {len(m.classes)} classes, "
            f"{len(m.shards) or m.num_samples} file(s)",
            f"read {format_size(self.bytes_in)}, wrote {format_size(self.bytes_out)} "
            f"in {self.seconds:.1f} s ({format_size(rate)}/s)",
        ]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} input(s) (listed in the manifest):")
            lines += [f"  {s.path}: {s.reason}" for s in self.skipped[:10]]
            if len(self.skipped) > 10:
                lines.append(f"  ... and {len(self.skipped) - 10} more (packer inspect --skipped)")
        return "\n".join(lines)


def plan_shards(sizes: Sequence[int], shard_size: int) -> tuple[np.ndarray, list[int]]:
    """Assign consecutive samples to shards of at most ``shard_size`` bytes (one big sample may
    exceed it alone). Returns the shard of every sample and the planned bytes of every shard."""
    shard_of = np.zeros(len(sizes), dtype=np.int32)
    planned: list[int] = []
    current = 0
    for i, size in enumerate(sizes):
        if not planned or (current > 0 and current + size > shard_size):
            planned.append(0)
            current = 0
        current += size
        planned[-1] += size
        shard_of[i] = len(planned) - 1
    return shard_of, planned


def _check_destination(dst: Path, overwrite: bool) -> None:
    if dst.exists() and not overwrite:
        raise DestinationError(f"destination {str(dst)!r} exists; pass --overwrite to replace it")
    parent = dst.parent if str(dst.parent) else Path(".")
    if not parent.is_dir():
        raise DestinationError(f"cannot create {str(dst)!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise DestinationError(
            f"cannot create {str(dst)!r}: folder {str(parent)!r} is not writable"
        )


def _validate(fmt_name: str | None, dst: Path, workers: int | None, check: str) -> ModuleType:
    fmt = by_name(fmt_name) if fmt_name else format_for(dst)
    if workers is not None and workers < 1:
        raise PackerError(f"invalid workers {workers}; expected 1 or more")
    if check not in CHECKS:
        raise PackerError(f"invalid check {check!r}; expected one of {', '.join(CHECKS)}")
    return fmt


def _write_all(
    fmt: ModuleType,
    partial: Path,
    source: Scan,
    shard_size: int,
    workers: int,
    strict: bool,
    check: str,
    progress: bool,
) -> tuple[Manifest, list[SkippedInput]]:
    samples = source.samples
    shard_of, planned = plan_shards([s.size for s in samples], shard_size)
    skipped = list(source.skipped)
    if strict and skipped:
        raise InputFileError(f"{skipped[0].path}: {skipped[0].reason} (--strict)")
    rows: list[tuple[int, int, int, int, int]] = []
    keys: list[str] = []
    bar = tqdm(total=len(samples), unit="img", desc=f"convert → {fmt.NAME}", disable=not progress)
    start, done_bytes, last = time.perf_counter(), 0, 0.0
    loaded_iter = load_in_order((s.path for s in samples), workers, check, fmt.TRANSCODE)
    with fmt.Writer(partial, planned) as writer:
        for sample, shard, loaded in zip(samples, shard_of, loaded_iter):
            if loaded.data is None:
                skipped.append(SkippedInput(sample.path, loaded.reason or "unknown"))
                if strict:
                    raise InputFileError(f"{sample.path}: {loaded.reason} (--strict)")
            else:
                stored_shard = int(shard) if fmt.SHARDED else -1
                offset, length = writer.write(int(shard), sample.key, sample.label, loaded.data)
                rows.append((sample.label, stored_shard, offset, length, loaded.checksum))
                keys.append(sample.key)
            done_bytes += sample.size
            bar.update(1)
            now = time.perf_counter()
            if progress and now - last > 0.5:
                bar.set_postfix_str(f"{done_bytes / (now - start) / 1e6:.1f} MB/s")
                last = now
        shards = writer.close()
    bar.close()
    index = np.array(rows, dtype=INDEX_DTYPE) if rows else np.zeros(0, dtype=INDEX_DTYPE)
    files = {INDEX_NAME: write_index(partial, index), KEYS_NAME: write_keys(partial, keys)}
    manifest = Manifest(
        format=fmt.NAME,
        kind=source.kind,
        num_samples=len(rows),
        classes=source.classes,
        shards=shards,
        skipped=[{"path": s.path, "reason": s.reason} for s in skipped],
        source={"root": source.root, "files": len(samples), "bytes": source.total_bytes},
        options={"shard_size": shard_size, "check": check},
        files=files,
        layout_version=fmt.LAYOUT_VERSION,
    )
    if not rows:
        raise PackerError(
            f"no usable image in {source.root!r}: all {len(samples)} inputs were skipped"
        )
    write_manifest(partial, manifest)
    return manifest, skipped


def _publish(partial: Path, dst: Path) -> None:
    """Move the finished ``partial`` into place, replacing an old ``dst`` only at the end."""
    old = None
    if dst.exists() or dst.is_symlink():
        old = dst.with_name(dst.name + f".old-{os.getpid()}")
        os.replace(dst, old)
    os.replace(partial, dst)
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()


def _disk_full_error(exc: OSError, partial: Path, source: Scan) -> DestinationError:
    free = shutil.disk_usage(partial.parent).free
    return DestinationError(
        f"disk full while writing {str(partial)!r}: the source holds {format_size(source.total_bytes)}"
        f" and {format_size(free)} is free on that disk; free space and convert again"
    )


def convert(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    workers: int | None = None,
    overwrite: bool = False,
    strict: bool = False,
    check: str = "fast",
    progress: bool = True,
) -> ConvertResult:
    """Convert the image folder ``src`` (``<class>/<image>``) into a packed dataset at ``dst``.

    Args:
        src: the source folder.
        dst: the destination directory; its suffix (.lmdb .h5 .hdf5 .npy .bmp) picks the format.
        format: force a format by name (``lmdb``, ``hdf5``, ``npy``, ``bmp``) whatever the suffix.
        shard_size: roll to a new shard past this many bytes (``"1GiB"``, ``"512MB"``, an int).
        workers: parallel readers (default: the CPU count). The output does not depend on it.
        overwrite: replace an existing ``dst`` (only once the new one is complete).
        strict: make an unusable input file fatal instead of skipping and recording it.
        check: ``"fast"`` (header, verify, JPEG end marker) or ``"decode"`` (decode every pixel).
        progress: show a tqdm progress bar.

    Raises:
        PackerError: bad arguments, a bad source or destination, or (with ``strict``) a bad file.
    """
    src_path, dst_path = Path(src), Path(os.fspath(dst).rstrip("/") or "/")
    fmt = _validate(format, dst_path, workers, check)
    size = parse_size(shard_size)
    _check_destination(dst_path, overwrite)
    source = scan(src_path)
    partial = dst_path.with_name(dst_path.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    start = time.perf_counter()
    try:
        manifest, skipped = _write_all(
            fmt, partial, source, size, workers or default_workers(), strict, check, progress
        )
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise _disk_full_error(exc, partial, source) from exc
        raise DestinationError(f"writing {str(partial)!r} failed: {exc}") from exc
    _publish(partial, dst_path)
    bytes_out = sum(f.stat().st_size for f in dst_path.rglob("*") if f.is_file())
    return ConvertResult(
        dst=dst_path,
        manifest=manifest,
        seconds=time.perf_counter() - start,
        bytes_in=source.total_bytes,
        bytes_out=bytes_out,
        skipped=skipped,
    )
