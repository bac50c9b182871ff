"""``packer merge DST`` of the parts ``packer pack ... --part I/N`` wrote.

Part ``I`` holds the samples of the ``I``-th run of consecutive inputs, its shards numbered from
0, their checkpoints and ``part.json`` (the job's fingerprint, its counts and skipped inputs).
Merging checks that all ``N`` parts are there, complete and of the same job (inputs, ``fn``,
options), hard-links (or copies) their shards into ``DST.partial/`` numbered on from one part to
the next, writes the tables and manifest from the checkpoints (the records pointing at the
renumbered shards), publishes ``DST`` and only then deletes the parts. The samples, keys and
order are those of one run; the shard boundaries are the parts' own.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from packer.core.fields import FieldSpec
from packer.core.manifest import fsync_dir, shard_name
from packer.errors import PackerError
from packer.formats import by_name
from packer.source.images import SkippedInput
from packer.write.destination import DestinationLock, check_destination, partial_path, publish
from packer.write.loading import Loaded
from packer.write.pipeline import Job, finalize
from packer.write.result import ConvertResult
from packer.write.resume import Checkpoint, Progress, describe_change
from packer.write.tasks import PART_MANIFEST, part_path
from packer.write.writer import WrittenSource

__all__ = ["is_pack_part", "merge_packed"]


def _record(part: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (part / PART_MANIFEST).read_bytes().decode("utf-8", "surrogateescape")
    )
    return data


def is_pack_part(part: Path) -> bool:
    """Whether ``part`` was written by ``packer pack --part`` (not ``packer convert``)."""
    try:
        return "packer_pack_part" in _record(part)
    except (OSError, ValueError):
        return False


def _parts(dst: Path, complete: dict[int, Path]) -> list[tuple[Path, dict[str, Any]]]:
    """Every part, in order, checked to be of one job."""
    records = {i: _record(path) for i, path in complete.items()}
    first = next(iter(records.values()))
    count = first["part"][1]
    missing = [str(part_path(dst, i)) for i in range(count) if i not in records]
    if missing:
        raise PackerError(
            f"cannot merge {str(dst)!r}: part(s) missing or incomplete: {', '.join(missing)}. "
            "Run (or finish with --resume) packer pack FUNCTION INPUTS DST --part I/N for each"
        )
    for i, record in records.items():
        change = describe_change(first["job"], record["job"])
        if record["part"][1] != count or i >= count:
            change = f"it is part {record['part'][0]}/{record['part'][1]}, not of {count}"
        if change:
            raise PackerError(
                f"parts {str(complete[0])!r} and {str(complete[i])!r} are not of the same "
                f"pack: {change}. Pack the mismatched part again with the same command"
            )
    return [(complete[i], records[i]) for i in range(count)]


def _checkpoints(path: Path, record: dict[str, Any], base: int, suffix: str) -> list[Checkpoint]:
    """A part's checkpoints, renumbered to follow ``base`` shards."""
    out = []
    for k in range(record["shards"]):
        checkpoint = Progress(path).load(k)
        shard = checkpoint.shard if checkpoint is not None else None
        try:
            intact = shard is not None and (path / shard.name).stat().st_size == shard.bytes
        except OSError:
            intact = False
        if checkpoint is None or shard is None or not intact:
            raise PackerError(
                f"part {str(path)!r} lacks shard {k} (or its checkpoint) or it was changed; "
                "pack that part again"
            )
        checkpoint.shard = replace(shard, name=shard_name(base + k, suffix))
        checkpoint.records["file"] = base + k
        out.append(checkpoint)
    return out


def merge_packed(
    dst: Path, complete: dict[int, Path], *, overwrite: bool, progress: bool
) -> ConvertResult:
    """Join the parts of ``dst`` (by number) into the dataset ``dst``.

    Raises:
        PackerError: a part missing, incomplete or of another job; ``dst`` exists (without
            ``overwrite``).
    """
    start = time.perf_counter()
    parts = _parts(dst, complete)
    fmt = by_name(parts[0][1]["job"]["format"])
    seen = [(path, r["options"]) for path, r in parts if r["options"]]
    if not seen:
        raise PackerError(f"no part of {str(dst)!r} holds a sample: nothing to merge")
    options = seen[0][1]
    for path, other in seen:
        if other != options:
            names = [f["name"] for f in other["fields"]], [f["name"] for f in options["fields"]]
            raise PackerError(
                f"part {str(path)!r} has fields {names[0]}, part {str(seen[0][0])!r} "
                f"{names[1]}: declare the fields (--fields) so every part writes the same ones"
            )
    check_destination(dst, overwrite, resume=True)
    done: list[Checkpoint] = []
    for path, record in parts:
        done += _checkpoints(path, record, len(done), fmt.Writer.SHARD_SUFFIX)
    partial = partial_path(dst)
    specs = [FieldSpec(f["name"], f["kind"]) for f in options["fields"]]
    source = WrittenSource(fields=specs, root="packer.pack", source_kind="pack")
    source.files = sum(r["files"] for _, r in parts)
    source.total_bytes = sum(r["bytes"] for _, r in parts)
    source.skipped = [SkippedInput(s["path"], s["reason"]) for _, r in parts for s in r["skipped"]]
    job = Job(fmt=fmt, layout="shards", partial=partial, source=source, loader=Loaded,
              cpu_bound=False, shard_size=0, workers=1, strict=True, progress=progress,
              unit="samples")  # fmt: skip
    with DestinationLock(dst):
        check_destination(dst, overwrite, resume=True)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        base = 0
        for path, record in parts:
            for k in range(record["shards"]):
                name = shard_name(k, fmt.Writer.SHARD_SUFFIX)
                target = partial / shard_name(base + k, fmt.Writer.SHARD_SUFFIX)
                try:
                    os.link(path / name, target)
                except OSError:
                    shutil.copy2(path / name, target)
            base += record["shards"]
        fsync_dir(partial)
        manifest, skipped = finalize(job, done, options)
        publish(partial, dst)
        for path, _ in parts:
            shutil.rmtree(path)
    left_out = sum(r["left_out"] for _, r in parts)
    notes = [f"merged {len(parts)} parts: {', '.join(p.name for p, _ in parts)}"]
    if left_out:
        notes.append(f"{left_out} input(s) left out by fn (it returned None)")
    return ConvertResult(
        dst=dst,
        manifest=manifest,
        seconds=time.perf_counter() - start,
        bytes_in=source.total_bytes,
        bytes_out=sum(s.bytes for s in manifest.shards),
        skipped=skipped,
        notes=notes,
    )
