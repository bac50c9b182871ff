"""Durable progress of a conversion, so ``--resume`` continues from the last complete shard.

Inside ``DST.partial/_progress/``: ``fingerprint.json`` (what the output depends on: format,
options, the source's keys and sizes) and one ``shard-NNNNN.json`` checkpoint per finished
shard (its manifest entry, index rows, keys and skipped inputs), each written to a temp name,
fsync'd and renamed. The folder is removed before the output is published. Images and video
share it: a checkpoint holds sample rows and record rows alike.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from packer.errors import PackerError
from packer.manifest import ShardInfo, fsync_dir
from packer.sources import SkippedInput

__all__ = ["Checkpoint", "Progress", "fingerprint", "skipped_dicts"]

PROGRESS_DIR = "_progress"


def fingerprint(source: Any, fmt_name: str, options: dict[str, Any]) -> dict[str, Any]:
    """What the output bytes depend on: the format, options and every input's key and size."""
    digest = xxhash.xxh3_64()
    for s in source.samples:
        digest.update(f"{s.key}\t{s.label}\t{s.size}\n".encode("utf-8", "surrogateescape"))
    return {
        "format": fmt_name,
        "options": options,
        "root": source.root,
        "classes": len(source.classes),
        "files": len(source.samples),
        "bytes": source.total_bytes,
        "inputs_xxh3_64": digest.hexdigest(),
    }


def describe_change(old: dict[str, Any], new: dict[str, Any]) -> str | None:
    """Say what differs between two fingerprints, or None if nothing does."""
    changes = []
    for name in ("format", "root", "classes", "files", "bytes"):
        if old.get(name) != new.get(name):
            changes.append(f"{name} {old.get(name)!r} → {new.get(name)!r}")
    for name in sorted(set(old.get("options", {})) | set(new.get("options", {}))):
        before, after = old.get("options", {}).get(name), new.get("options", {}).get(name)
        if before != after:
            changes.append(f"option {name} {before!r} → {after!r}")
    if not changes and old.get("inputs_xxh3_64") != new.get("inputs_xxh3_64"):
        changes.append("some input files were renamed, replaced or changed size")
    return "; ".join(changes) or None


@dataclass
class Checkpoint:
    """One finished planned shard: its entry (None if it has no shard file) and its samples:
    ``samples`` rows ``[label, count]``, ``records`` rows ``[file, length, offset, checksum]``."""

    shard: ShardInfo | None = None
    samples: list[list[int]] = field(default_factory=list)
    records: list[list[int]] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", errors="surrogateescape") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class Progress:
    """The progress folder of one ``.partial`` output."""

    def __init__(self, partial: Path) -> None:
        self.dir = partial / PROGRESS_DIR

    def start(self, fp: dict[str, Any]) -> None:
        """Begin a fresh conversion: record its fingerprint."""
        self.dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.dir / "fingerprint.json", fp)

    def resume(self, fp: dict[str, Any]) -> list[Checkpoint]:
        """Load the finished shards, refusing if the source or options changed since."""
        path = self.dir / "fingerprint.json"
        if not path.is_file():
            raise PackerError(
                f"{str(self.dir.parent)!r} holds no resumable progress; convert without --resume"
            )
        change = describe_change(json.loads(path.read_text()), fp)
        if change:
            raise PackerError(
                f"cannot resume {str(self.dir.parent)!r}: {change}. Convert again without "
                "--resume (with --overwrite) to start over"
            )
        done: list[Checkpoint] = []
        while (checkpoint := self.load(len(done))) is not None:
            done.append(checkpoint)
        return done

    def load(self, number: int) -> Checkpoint | None:
        """The checkpoint of planned shard ``number``, or None if it is not complete."""
        ckpt = self.dir / f"shard-{number:05d}.json"
        if not ckpt.is_file():
            return None
        data = json.loads(ckpt.read_text(encoding="utf-8", errors="surrogateescape"))
        shard = ShardInfo(**data["shard"]) if data["shard"] else None
        return Checkpoint(shard, data["samples"], data["records"], data["keys"], data["skipped"])

    def save(self, number: int, checkpoint: Checkpoint) -> None:
        """Durably record that planned shard ``number`` is complete."""
        data = {  # not asdict(): it deep-copies every row (measured: 5% of a --check fast run)
            "shard": asdict(checkpoint.shard) if checkpoint.shard is not None else None,
            "samples": checkpoint.samples,
            "records": checkpoint.records,
            "keys": checkpoint.keys,
            "skipped": checkpoint.skipped,
        }
        _write_json(self.dir / f"shard-{number:05d}.json", data)

    def remove(self) -> None:
        """Delete the progress folder (before publishing the output)."""
        shutil.rmtree(self.dir, ignore_errors=True)


def skipped_dicts(items: list[SkippedInput]) -> list[dict[str, str]]:
    """Skipped inputs as manifest entries."""
    return [{"path": s.path, "reason": s.reason} for s in items]
