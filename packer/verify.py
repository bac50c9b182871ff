"""Check a packed dataset against its manifest: shard checksums, per-sample checksums, decoding.

Returns a report; never prints. ``packer verify`` echoes it and exits non-zero on any problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from packer.decode import decode
from packer.errors import PackerError
from packer.formats import by_name
from packer.manifest import (
    Manifest,
    bytes_checksum,
    file_checksum,
    load_index,
    load_keys,
    load_manifest,
)

__all__ = ["Problem", "VerifyReport", "verify"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (file, and sample key when known) and what."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass
class VerifyReport:
    """What ``verify`` checked and found."""

    root: Path
    files_checked: int = 0
    samples_checked: int = 0
    decoded: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def summary(self) -> str:
        """Human-readable result, one line per problem."""
        head = (
            f"{self.root}: checked {self.files_checked} file(s), {self.samples_checked} sample(s)"
            + (f", decoded {self.decoded}" if self.decoded else "")
        )
        if self.ok:
            return head + ": OK"
        return "\n".join([head + f": {len(self.problems)} problem(s)", *map(str, self.problems)])


def _check_files(root: Path, manifest: Manifest, report: VerifyReport) -> set[str]:
    bad: set[str] = set()
    named: list[tuple[str, str, int | None]] = [
        (s.name, s.xxh3_64, s.bytes) for s in manifest.shards
    ]
    named += [(name, digest, None) for name, digest in manifest.files.items()]
    for name, digest, size in named:
        path = root / name
        report.files_checked += 1
        if not path.is_file():
            report.problems.append(Problem(name, "missing"))
            bad.add(name)
        elif size is not None and path.stat().st_size != size:
            report.problems.append(
                Problem(name, f"{path.stat().st_size} bytes, manifest records {size}")
            )
            bad.add(name)
        elif file_checksum(path) != digest:
            report.problems.append(Problem(name, "checksum differs from the manifest"))
            bad.add(name)
    return bad


def _check_videos(
    root: Path,
    manifest: Manifest,
    index: np.ndarray,
    report: VerifyReport,
    full: bool,
    progress: bool,
) -> None:
    """Per-video checks: every frame's checksum (``frames.npy``) and, with ``full``, decoding."""
    from packer.video.formats import video_format
    from packer.video.layout import load_frames

    frames = load_frames(root, manifest, index)
    reader = video_format(manifest.format).Reader(root, manifest, index, frames["length"])
    for v in tqdm(range(len(index)), unit="video", desc="verify", disable=not progress):
        where = f"video {reader.keys[v]!r}"
        first, count = int(index["offset"][v]), int(index["length"][v])
        try:
            stored = reader.read(v, np.arange(count))
        except (PackerError, OSError) as exc:
            report.problems.append(Problem(where, f"cannot read: {exc}"))
            continue
        report.samples_checked += 1
        for j, data in enumerate(stored):
            if bytes_checksum(data) != int(frames["checksum"][first + j]):
                report.problems.append(Problem(f"{where} frame {j}", "bytes differ from checksum"))
            elif full:
                try:
                    decode(data, "numpy")
                    report.decoded += 1
                except (OSError, ValueError, SyntaxError) as exc:
                    report.problems.append(Problem(f"{where} frame {j}", f"does not decode: {exc}"))
    reader.close()


def verify(path: str | os.PathLike[str], full: bool = False, progress: bool = True) -> VerifyReport:
    """Verify the packed dataset at ``path``.

    Checks every data/index file's xxh3 checksum and size against the manifest, then reads every
    sample and compares its bytes' checksum with the index, naming the shard and sample key of
    each mismatch. With ``full``, also decodes every sample.
    """
    root = Path(path)
    manifest = load_manifest(root)
    report = VerifyReport(root)
    bad_files = _check_files(root, manifest, report)
    if {"index.npy", "keys.txt"} & bad_files:
        return report  # per-sample checks need a sound index
    index = load_index(root, manifest)
    if manifest.kind == "video":
        _check_videos(root, manifest, index, report, full, progress)
        return report
    keys = load_keys(root)
    reader = by_name(manifest.format).Reader(root, manifest, index)
    names = [s.name for s in manifest.shards]
    for i in tqdm(range(len(index)), unit="sample", desc="verify", disable=not progress):
        where = (
            f"{names[index['shard'][i]] if index['shard'][i] >= 0 else 'file'} sample {keys[i]!r}"
        )
        try:
            data = reader.read(i)
        except (PackerError, OSError) as exc:
            report.problems.append(Problem(where, f"cannot read: {exc}"))
            continue
        report.samples_checked += 1
        if bytes_checksum(data) != int(index["checksum"][i]):
            report.problems.append(Problem(where, "stored bytes differ from their checksum"))
        elif full:
            try:
                decode(data, "numpy")
                report.decoded += 1
            except (OSError, ValueError, SyntaxError) as exc:
                report.problems.append(Problem(where, f"does not decode: {exc}"))
    reader.close()
    return report
