"""``packer merge DST``: join the parts ``DST.part-0 ... DST.part-{N-1}`` into ``DST``.

Each part (``packer convert SRC DST --part I/N``, see :mod:`packer.write.tasks`) holds the shard
files of the planned shards ``k % N == I``, their checkpoints and ``part.json``. Merging checks
that all ``N`` parts are there, complete and of the same conversion (source, format and options),
hard-links (or copies, across file systems) their files into ``DST.partial/``, writes the tables
and manifest from the checkpoints exactly as one run would, publishes ``DST`` and only then
deletes the parts: an interrupted merge leaves them intact, to merge again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.core.manifest import fsync_dir
from packer.errors import DestinationError, PackerError
from packer.formats import by_name
from packer.remote.storage import is_url
from packer.source.images import SkippedInput
from packer.write.convert import ConvertResult
from packer.write.destination import DestinationLock, check_destination, partial_path, publish
from packer.write.pack_merge import is_pack_part, merge_packed
from packer.write.pipeline import Job, finalize
from packer.write.resume import PROGRESS_DIR, Checkpoint, Progress, describe_change
from packer.write.tasks import PART_MANIFEST, PART_VERSION

__all__ = ["find_parts", "merge"]


@dataclass
class RecordedSource:
    """What :func:`packer.write.pipeline.finalize` reads of a source, as a part recorded it."""

    root: str
    kind: str
    classes: list[str]
    samples: range
    skipped: list[SkippedInput] = field(default_factory=list)
    recorded: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return self.recorded


def _no_loader(sample: Any) -> Any:
    raise PackerError("a merge loads no input")  # finalize never loads


def find_parts(dst: Path) -> tuple[dict[int, Path], list[Path]]:
    """The complete parts of ``dst`` by number, and the folders of incomplete ones."""
    pattern = re.compile(re.escape(dst.name) + r"\.part-(\d+)(\.partial)?$")
    complete, incomplete = {}, []
    for path in sorted(dst.parent.iterdir()) if dst.parent.is_dir() else []:
        match = pattern.match(path.name)
        if not match or not path.is_dir():
            continue
        if match.group(2) or not (path / PART_MANIFEST).is_file():
            incomplete.append(path)
        else:
            complete[int(match.group(1))] = path
    return complete, incomplete


def _load_parts(dst: Path) -> tuple[dict[int, Path], list[dict[str, Any]]]:
    complete, incomplete = find_parts(dst)
    if not complete and not incomplete:
        raise PackerError(
            f"no parts of {str(dst)!r} found (expected {dst.name}.part-0 ... next to it, written "
            "by packer convert SRC DST --part I/N)"
        )
    records = [json.loads((p / PART_MANIFEST).read_text()) for p in complete.values()]
    for path, record in zip(complete.values(), records):
        if record.get("packer_part") != PART_VERSION:
            raise PackerError(f"{str(path)!r} is not a part this packer can merge")
    first, first_path = records[0], next(iter(complete.values())) if complete else None
    for path, record in zip(complete.values(), records):
        change = describe_change(first["fingerprint"], record["fingerprint"])
        if record["part"][1] != first["part"][1]:
            change = (
                f"it is part {record['part'][0]}/{record['part'][1]}, not of {first['part'][1]}"
            )
        if change:
            raise PackerError(
                f"parts {str(first_path)!r} and {str(path)!r} are not of the same conversion: "
                f"{change}. Convert the mismatched part again with the same command"
            )
    count = first["part"][1] if records else 0
    missing = [i for i in range(count) if i not in complete]
    extra = [i for i in complete if i >= count]
    if incomplete or missing or extra or not records:
        names = [str(p) for p in incomplete] + [str(dst) + f".part-{i}" for i in missing]
        raise PackerError(
            f"cannot merge {str(dst)!r}: part(s) missing or incomplete: {', '.join(names)}"
            + (f"; unexpected part(s) {extra} of {count}" if extra else "")
            + ". Run (or finish with --resume) packer convert SRC DST --part I/N for each"
        )
    return complete, records


def _link_tree(part: Path, partial: Path) -> None:
    """Hard-link (or copy) every data file of ``part`` into ``partial``, syncing the folders."""
    touched = {partial}
    for root, dirs, files in os.walk(part):
        here = Path(root)
        if here == part:
            dirs[:] = [d for d in dirs if d != PROGRESS_DIR]
            files = [f for f in files if f != PART_MANIFEST]
        target = partial / here.relative_to(part)
        target.mkdir(exist_ok=True)
        touched.add(target)
        for name in files:
            try:
                os.link(here / name, target / name)
            except OSError:
                shutil.copy2(here / name, target / name)
    for folder in touched:
        fsync_dir(folder)


def _has_file(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _merge_job(first: dict[str, Any], partial: Path, progress: bool) -> Job:
    """The pipeline's view of the conversion part 0 records (no loader: nothing is read)."""
    source = RecordedSource(
        first["source"]["root"],
        first["kind"],
        first["classes"],
        range(first["source"].get("files", 0)),
        [SkippedInput(s["path"], s["reason"]) for s in first["scan_skipped"]],
        first["source"],
    )
    return Job(
        fmt=by_name(first["format"]),
        layout=first["layout"],
        partial=partial,
        source=source,
        loader=_no_loader,
        cpu_bound=False,
        shard_size=0,
        workers=1,
        strict=False,
        progress=progress,
        unit=first["unit"],
    )


def merge(
    dst: str | os.PathLike[str], *, overwrite: bool = False, progress: bool = True
) -> ConvertResult:
    """Join the complete parts ``DST.part-0 ... DST.part-{N-1}`` into the dataset ``dst``; the
    same bytes as one ``packer convert`` of the same source and options.

    Raises:
        PackerError: a part missing, incomplete or of another conversion; ``dst`` exists
            (without ``overwrite``).
    """
    if is_url(dst):
        raise DestinationError(
            f"merge() joins local parts, not those staged for the URL {dst!r}: use "
            "packer.merge_to_url(url, storage_options=...), which joins the parts staged by "
            "convert_to_url(..., part=) and uploads the result (the CLI does so for packer merge URL)"
        )
    start = time.perf_counter()
    dst = Path(os.fspath(dst).rstrip("/") or "/")
    complete, _ = find_parts(dst)
    if complete and is_pack_part(next(iter(complete.values()))):
        return merge_packed(dst, complete, overwrite=overwrite, progress=progress)
    parts, records = _load_parts(dst)
    first = records[0]
    check_destination(dst, overwrite, Path(first["source"]["root"]), resume=True)
    planned = first["planned_shards"]
    done: list[Checkpoint | None] = [None] * planned
    for path, record in zip(parts.values(), records):
        for k in record["shards"]:
            done[k] = Progress(path).load(k)
            shard = done[k].shard if done[k] is not None else None
            if done[k] is None or (shard and not _has_file(path / shard.name, shard.bytes)):
                raise PackerError(
                    f"part {str(path)!r} lacks shard {k} (or its checkpoint) or it was changed; "
                    f"convert part {record['part'][0]}/{record['part'][1]} again"
                )
    if any(c is None for c in done):
        absent = [k for k, c in enumerate(done) if c is None]
        raise PackerError(f"no part holds planned shard(s) {absent[:10]}; convert again")
    partial = partial_path(dst)
    job = _merge_job(first, partial, progress)
    source = job.source
    with DestinationLock(dst):
        check_destination(dst, overwrite, Path(source.root), resume=True)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir()
        for path in parts.values():
            _link_tree(path, partial)
        manifest, skipped = finalize(job, [c for c in done if c is not None], first["options"])
        publish(partial, dst)
        for path in parts.values():
            shutil.rmtree(path)
    return ConvertResult(
        dst=dst,
        manifest=manifest,
        seconds=time.perf_counter() - start,
        bytes_in=int(first["source"].get("bytes", 0)),
        bytes_out=sum(f.stat().st_size for f in dst.rglob("*") if f.is_file()),
        skipped=skipped,
        notes=[f"merged {len(parts)} parts: {', '.join(p.name for p in parts.values())}"],
    )
