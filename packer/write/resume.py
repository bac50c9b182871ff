"""Durable progress of a conversion, so ``--resume`` continues from the last complete shard.

Inside ``DST.partial/_progress/``: ``fingerprint.json`` (what the output depends on: format,
options, the source's keys, sizes and modification times) and a checkpoint per finished shard: its sample rows
(``shard-NNNNN.samples.npy``), record rows (``shard-NNNNN.records.npy``) and keys
(``shard-NNNNN.keys.txt``, escaped as in ``keys.txt``), then — last, the mark that the shard is
complete — ``shard-NNNNN.json``: its manifest entry, skipped inputs and the checksums of the
three. Each file is written to a temp name, fsync'd and renamed. The folder is removed before
the output is published, ``fingerprint.json`` last (so a run killed meanwhile still knows what
the finished output was made from). Images and video share it: a checkpoint holds sample rows and record
rows alike.

A shard's rows are held compactly from its first sample on (:class:`Rows`: machine integers,
not a Python list per row).
"""

from __future__ import annotations

import json
import os
import shutil
from array import array
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import xxhash

from packer.core.manifest import (
    RECORD_DTYPE,
    ShardInfo,
    decode_keys,
    encode_keys,
    file_checksum,
    fsync_dir,
)
from packer.errors import PackerError
from packer.source.images import SkippedInput

__all__ = [
    "ROW_DTYPE",
    "Checkpoint",
    "Progress",
    "Rows",
    "changed_inputs",
    "fingerprint",
    "sample_folders",
    "skipped_dicts",
    "unstarted",
]

PROGRESS_DIR = "_progress"
CHECKPOINT_VERSION = 2  # version 1: the rows as JSON lists in shard-NNNNN.json (still read)
ROW_DTYPE = np.dtype([("label", "<i4"), ("count", "<i4")])  # a checkpoint's sample row
_TABLES = ("samples.npy", "records.npy", "keys.txt")  # a checkpoint's files besides its JSON


def _files(sample: Any) -> tuple[str, ...]:
    """The source files of a sample: its frames (a frame folder), its fields' files (a sample
    with fields), else its own path."""
    return getattr(sample, "frames", None) or getattr(sample, "files", None) or (sample.path,)


def sample_folders(source: Any) -> set[str]:
    """The folders the scan found samples in (a frame folder, or a file's folder); none for tar
    shards, a table, COCO (they name the files they read; no folder is listed)."""
    if getattr(source, "source_kind", "") in ("tars", "table", "coco", "hf"):
        return set()
    return {os.path.dirname(_files(s)[0]) for s in source.samples}


def _mtimes(sample: Any) -> list[int]:
    stamps = []
    for path in _files(sample):
        try:
            stamps.append(os.stat(path).st_mtime_ns)
        except OSError:
            stamps.append(-1)
    return stamps


def _stamp(path: str) -> list[int]:
    """A file every sample depends on (a COCO annotations file): its size and mtime_ns."""
    info = os.stat(path)  # the scan has just read it
    return [info.st_size, info.st_mtime_ns]


def fingerprint(source: Any, fmt_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """What the output bytes depend on: the format, options and every input's key, size and
    modification time (``mtime_ns``: a file rewritten in place with the same size differs).
    ``newest_mtime_ns`` is the latest of those times (an output written before it may be
    stale). Costs one ``stat`` per input file."""
    digest = xxhash.xxh3_64()
    newest = 0
    for s in source.samples:
        stamps = _mtimes(s)
        newest = max(newest, *stamps)
        line = f"{s.key}\t{s.label}\t{s.size}\t{','.join(map(str, stamps))}\n"
        digest.update(line.encode("utf-8", "surrogateescape"))
    stamps_of = {p: _stamp(p) for p in getattr(source, "inputs", [])}
    extra = {"side_inputs": stamps_of} if stamps_of else {}
    return {
        **extra,
        "format": fmt_name,
        "options": options,
        "root": source.root,
        "classes": len(source.classes),
        "files": len(source.samples),
        "bytes": source.total_bytes,
        "inputs_xxh3_64": digest.hexdigest(),
        "newest_mtime_ns": newest,
    }


def changed_inputs(source: Any, since_ns: int) -> list[str]:
    """The inputs of ``source`` with a file modified after ``since_ns`` (in source order)."""
    return [s.path for s in source.samples if max(_mtimes(s)) > since_ns]


def name_change(change: str | None, source: Any, since_ns: int) -> str | None:
    """``change`` with the input files modified after ``since_ns`` named, when the only
    change found is in the inputs' digest."""
    if change != INPUTS_CHANGED or source is None:
        return change
    paths = changed_inputs(source, since_ns)
    if not paths:
        return change
    more = f" (and {len(paths) - 1} more)" if len(paths) > 1 else ""
    return f"input {paths[0]!r}{more} was modified after the interrupted conversion began"


INPUTS_CHANGED = "some input files were renamed, replaced, or changed size or modification time"


def describe_change(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Say what differs between two fingerprints, or None if nothing does."""
    changes = []
    before, after = old.get("side_inputs") or {}, new.get("side_inputs") or {}
    for path in sorted(set(before) | set(after)):
        if before.get(path) != after.get(path):
            changes.append(f"annotations {path!r} changed since the interrupted conversion began")
    for name in ("format", "root", "classes", "files", "bytes"):
        if old.get(name) != new.get(name):
            changes.append(f"{name} {old.get(name)!r} → {new.get(name)!r}")
    for name in sorted(set(old.get("options", {})) | set(new.get("options", {}))):
        before, after = old.get("options", {}).get(name), new.get("options", {}).get(name)
        if before != after:
            changes.append(f"option {name} {before!r} → {after!r}")
    if not changes and old.get("inputs_xxh3_64") != new.get("inputs_xxh3_64"):
        changes.append(INPUTS_CHANGED)
    return "; ".join(changes) or None


def _no_samples() -> np.ndarray:
    return np.zeros(0, dtype=ROW_DTYPE)


def _no_records() -> np.ndarray:
    return np.zeros(0, dtype=RECORD_DTYPE)


@dataclass
class Checkpoint:
    """One finished planned shard: its entry (None if it has no shard file) and its samples:
    ``samples`` (``ROW_DTYPE``: label, count), ``records`` (``RECORD_DTYPE``: file, length,
    offset, checksum), ``keys`` and the inputs it skipped."""

    shard: ShardInfo | None = None
    samples: np.ndarray = field(default_factory=_no_samples)
    records: np.ndarray = field(default_factory=_no_records)
    keys: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)


class Rows:
    """The rows of the planned shard being written, as columns of machine integers (8 bytes a
    value; a list per row cost ~250 bytes a sample); :meth:`checkpoint` once it is done."""

    def __init__(self) -> None:
        self.labels, self.counts = array("q"), array("q")
        self.lengths, self.offsets, self.checksums = array("q"), array("q"), array("Q")
        self.keys: list[str] = []
        self.skipped: list[dict[str, str]] = []

    def add(
        self,
        label: int,
        key: str,
        lengths: Sequence[int],
        offsets: Sequence[int],
        checksums: Sequence[int],
    ) -> None:
        """One written sample: its label, key, and its records' lengths, offsets, checksums."""
        self.labels.append(label)
        self.counts.append(len(lengths))
        self.lengths.extend(lengths)
        self.offsets.extend(offsets)
        self.checksums.extend(checksums)
        self.keys.append(key)

    def checkpoint(
        self, shard: ShardInfo | None, file: int, offsets: np.ndarray | None = None
    ) -> Checkpoint:
        """The finished shard's checkpoint: every record in ``file``, at ``offsets`` when given
        (offsets known only once the shard is done) instead of those :meth:`add` had."""
        if offsets is not None and len(offsets) != len(self.offsets):
            raise PackerError(f"{len(offsets)} offsets for {len(self.offsets)} records")
        samples = np.zeros(len(self.labels), dtype=ROW_DTYPE)
        samples["label"], samples["count"] = self.labels, self.counts
        records = np.zeros(len(self.lengths), dtype=RECORD_DTYPE)
        records["file"], records["length"] = file, self.lengths
        records["offset"] = self.offsets if offsets is None else offsets
        records["checksum"] = np.frombuffer(self.checksums, dtype=np.uint64)
        return Checkpoint(shard, samples, records, self.keys, self.skipped)


def _write_file(path: Path, write: Callable[[IO[bytes]], Any]) -> str:
    """Write ``path`` through a temp name, fsync'd and renamed; return its checksum."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return file_checksum(path)


def _write_json(path: Path, data: Any) -> None:
    payload = json.dumps(data).encode("utf-8", "surrogateescape")
    _write_file(path, lambda fh: fh.write(payload))
    fsync_dir(path.parent)


def _table(path: Path, dtype: np.dtype, rows: int) -> np.ndarray | None:
    try:
        table = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    return table if table.dtype == dtype and table.shape == (rows,) else None


def _from_lists(data: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The rows of a version-1 checkpoint (JSON lists) as arrays."""
    samples = np.array([tuple(r) for r in data["samples"]], dtype=ROW_DTYPE)
    records = np.array([tuple(r) for r in data["records"]], dtype=RECORD_DTYPE)
    return samples.reshape(-1), records.reshape(-1), list(data["keys"])


class Progress:
    """The progress folder of one ``.partial`` output."""

    def __init__(self, partial: Path) -> None:
        self.dir = partial / PROGRESS_DIR

    def start(self, fp: dict[str, Any]) -> None:
        """Begin a fresh conversion: record its fingerprint."""
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.dir / "fingerprint.json", fp)

    def fingerprint(self) -> tuple[dict[str, Any], int] | None:
        """The recorded fingerprint and when it was written (``mtime_ns``), or None."""
        path = self.dir / "fingerprint.json"
        try:
            return json.loads(path.read_text()), path.stat().st_mtime_ns
        except (OSError, ValueError):
            return None

    def resume(self, fp: dict[str, Any], source: Any = None) -> list[Checkpoint]:
        """Load the finished shards, refusing if the source or options changed since (naming
        the input files modified since, when ``source`` is given)."""
        recorded = self.fingerprint()
        if recorded is None:
            raise PackerError(
                f"{str(self.dir.parent)!r} holds no resumable progress; convert without --resume"
            )
        change = name_change(describe_change(recorded[0], fp), source, recorded[1])
        if change:
            raise PackerError(
                f"cannot resume {str(self.dir.parent)!r}: {change}. Convert again without "
                "--resume (with --overwrite) to start over"
            )
        done: list[Checkpoint] = []
        while (checkpoint := self.load(len(done))) is not None:
            done.append(checkpoint)
        return done

    def finished(self) -> list[Checkpoint]:
        """Every complete checkpoint present, in any order (for estimates; not a resume)."""
        found = []
        for path in sorted(self.dir.glob("shard-*.json")):
            try:
                checkpoint = self.load(int(path.name[6:11]))
            except (ValueError, KeyError, TypeError, PackerError):
                continue
            if checkpoint is not None:
                found.append(checkpoint)
        return found

    def _path(self, number: int, suffix: str) -> Path:
        return self.dir / f"shard-{number:05d}.{suffix}"

    def load(self, number: int) -> Checkpoint | None:
        """The checkpoint of planned shard ``number``, or None if it is not complete (or one
        of its files does not match what its JSON recorded: the shard is then written again)."""
        ckpt = self._path(number, "json")
        if not ckpt.is_file():
            return None
        data = json.loads(ckpt.read_bytes().decode("utf-8", "surrogateescape"))
        shard = ShardInfo(**data["shard"]) if data["shard"] else None
        version = data.get("checkpoint_version", 1)
        if version == 1:
            return Checkpoint(shard, *_from_lists(data), data["skipped"])
        if version != CHECKPOINT_VERSION:
            raise PackerError(
                f"{str(ckpt)!r} is a checkpoint of version {version!r}, which this packer does "
                "not read; convert again without --resume (with --overwrite)"
            )
        paths = [self._path(number, name) for name in _TABLES]
        try:
            if [file_checksum(p) for p in paths] != data["xxh3_64"]:
                return None
            keys = decode_keys(paths[2].read_bytes())
        except OSError:
            return None
        samples = _table(paths[0], ROW_DTYPE, len(keys))
        records = _table(paths[1], RECORD_DTYPE, data["records"])
        if samples is None or records is None or int(samples["count"].sum()) != len(records):
            return None
        return Checkpoint(shard, samples, records, keys, data["skipped"])

    def save(self, number: int, checkpoint: Checkpoint) -> None:
        """Durably record that planned shard ``number`` is complete: its tables, then (once
        they are durable) its JSON."""
        self._path(number, "json").unlink(missing_ok=True)  # a stale one must not vouch for them
        tables = (checkpoint.samples, checkpoint.records)
        sums = [
            _write_file(self._path(number, _TABLES[0]), lambda fh: np.save(fh, tables[0])),
            _write_file(self._path(number, _TABLES[1]), lambda fh: np.save(fh, tables[1])),
            _write_file(
                self._path(number, _TABLES[2]),
                lambda fh: fh.writelines(encode_keys(checkpoint.keys)),
            ),
        ]
        fsync_dir(self.dir)
        data = {  # not asdict(checkpoint): it would deep-copy the rows
            "checkpoint_version": CHECKPOINT_VERSION,
            "shard": asdict(checkpoint.shard) if checkpoint.shard is not None else None,
            "records": len(checkpoint.records),
            "xxh3_64": sums,
            "skipped": checkpoint.skipped,
        }
        _write_json(self._path(number, "json"), data)

    def remove(self) -> None:
        """Delete the progress folder (before publishing the output): every checkpoint, then
        ``fingerprint.json``, then the folder, so a kill meanwhile leaves the fingerprint or
        nothing to compare with."""
        try:
            entries = sorted(os.scandir(self.dir), key=lambda e: e.name == "fingerprint.json")
        except FileNotFoundError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        os.rmdir(self.dir)


def unstarted(partial: Path) -> bool:
    """Whether ``partial`` is a conversion's folder stopped before anything worth keeping: a
    real folder holding nothing but ``_progress/`` (or nothing at all), which holds nothing but
    the fingerprint (``fingerprint.json``, or its temp file: a kill during its first write), no
    checkpoint. A plain run or ``--resume`` starts it afresh. A folder holding anything else
    (shards, a split, files packer did not write) is not unstarted."""
    if partial.is_symlink() or not partial.is_dir():
        return False
    progress = partial / PROGRESS_DIR
    mine = ("fingerprint.json", "fingerprint.json.tmp")
    try:
        if any(entry.name != PROGRESS_DIR for entry in os.scandir(partial)):
            return False
        if not progress.exists():
            return True
        if progress.is_symlink() or not progress.is_dir():
            return False
        return all(
            e.name in mine and e.is_file(follow_symlinks=False) for e in os.scandir(progress)
        )
    except OSError:
        return False


def skipped_dicts(items: list[SkippedInput]) -> list[dict[str, str]]:
    """Skipped inputs as manifest entries."""
    return [{"path": s.path, "reason": s.reason} for s in items]
