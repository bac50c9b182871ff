"""The writer of :func:`packer.pack`: :class:`packer.write.writer.Writer` that can resume.

Before each shard's checkpoint it records, in ``DST.partial/_progress/pack-NNNNN.json``, where
the inputs stand once that shard is durable: the next sample's position (input, sample of that
input), the inputs skipped or left out so far, the planned shard sizes, the fields and the
source's counts. A resumed run (same fingerprint: format, options, ``fn`` and inputs) loads the
complete checkpoints, removes any shard file past them (a shard a kill cut short), restores that
state and continues from the recorded position: the same bytes as a run never stopped.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from packer.core.fields import FieldSpec
from packer.core.manifest import Manifest, fsync_dir, shard_name
from packer.errors import DestinationError
from packer.source.images import SkippedInput
from packer.write.destination import check_destination, lock_holder, publish
from packer.write.resume import Checkpoint, Progress, unstarted
from packer.write.tasks import PART_MANIFEST
from packer.write.writer import Writer

__all__ = ["PackWriter"]


PACK_PART_VERSION = 1  # part.json of a pack's part (a conversion's part has "packer_part")


def part_manifest(part: Path) -> Manifest:
    """A pack part's manifest as its ``part.json`` and checkpoints tell it (in memory)."""
    record = json.loads((part / PART_MANIFEST).read_bytes().decode("utf-8", "surrogateescape"))
    progress = Progress(part)
    done = [progress.load(k) for k in range(record["shards"])]
    if any(c is None for c in done):
        raise DestinationError(f"part {str(part)!r} lacks a shard's checkpoint")
    return _manifest(record, [c for c in done if c is not None])


def _manifest(record: dict[str, Any], done: list[Checkpoint]) -> Manifest:
    options = record["options"] or {}
    return Manifest(
        format=record["job"]["format"],
        kind="fields",
        num_samples=sum(len(c.keys) for c in done),
        classes=[],
        shards=[c.shard for c in done if c.shard is not None],
        skipped=record["skipped"],
        source={"root": "packer.pack", "files": record["files"], "bytes": record["bytes"]},
        options=dict(options, source_kind="pack", part=list(record["part"])),
    )


def _write_durable(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path``: a temp file, fsync'd, renamed, the folder fsync'd."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(json.dumps(data).encode("utf-8", "surrogateescape"))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _state_path(partial: Path, shard: int) -> Path:
    return partial / "_progress" / f"pack-{shard:05d}.json"


class PackWriter(Writer):
    """A local :class:`Writer` whose progress resumes (``resume=True``) at an input position.

    Args:
        dst: the dataset to create.
        fingerprint: what the output depends on (``fn``, inputs, options); a resume with
            another one is refused, naming what changed.
        resume: continue ``DST.partial`` if it holds a run's progress (else start afresh).
        **options: :class:`Writer`'s.
    """

    def __init__(
        self, dst: str | os.PathLike[str], *, fingerprint: dict[str, Any], resume: bool,
        part: dict[str, Any] | None = None, **options: Any,
    ) -> None:  # fmt: skip
        self._fp, self._resume, self._part = fingerprint, resume, part
        self.position: tuple[int, int] = (0, 0)  # the next sample: (input, sample of it)
        self.resumed_at: tuple[int, int] | None = None
        self.left_out = 0  # inputs fn returned None for
        super().__init__(dst, **options)

    def _configure(self, dst: Any, *rest: Any) -> None:
        named = self._part["dst"] if self._part is not None else dst  # a part's format: DST's
        super()._configure(named, *rest)
        self.name = os.fspath(dst)

    def _fingerprint(self) -> dict[str, Any]:
        return self._fp

    def _setup(self) -> None:
        super()._setup()
        self._source.root = "packer.pack"

    def _options(self) -> dict[str, Any]:
        return {**super()._options(), "source_kind": "pack"}

    def _check_destination(self, overwrite: bool) -> None:
        check_destination(self.dst, overwrite, resume=self._resume)

    def _refuse_partial(self, overwrite: bool) -> None:
        if self._resume or overwrite or lock_holder(self.dst) is not None:
            return
        if self.partial.exists() and not unstarted(self.partial):
            raise DestinationError(
                f"{str(self.partial)!r} holds an interrupted pack (no process is writing it): "
                "pass resume=True (--resume) to continue it, or overwrite=True (--overwrite) "
                "to start over"
            )

    def _start(self, overwrite: bool) -> None:
        if not (self._resume and self.partial.is_dir() and not unstarted(self.partial)):
            super()._start(overwrite)
            return
        self._check_destination(overwrite)  # under the lock
        self._setup()
        self._done = self._progress.resume(self._fp)
        state = self._load_state(len(self._done))
        for shard in self._stale_shards(len(self._done)):
            shard.unlink()
        if state is None:
            return
        self.resumed_at = self.position = (state["next"][0], state["next"][1])
        self._planned = list(state["planned"])
        self._fields = {f["name"]: FieldSpec(f["name"], f["kind"]) for f in state["fields"]}
        self._source.fields = [self._fields[n] for n in sorted(self._fields)]
        self._source.files, self._source.total_bytes = state["files"], state["bytes"]
        self._source.skipped = [SkippedInput(s["path"], s["reason"]) for s in state["skipped"]]
        self.left_out = state["left_out"]
        self._keys = {key.casefold() for c in self._done for key in c.keys}
        self._bar.update(len(self._keys))

    def _load_state(self, done: int) -> dict[str, Any] | None:
        """The state recorded with the last complete checkpoint (None: none is complete)."""
        if done == 0:
            return None
        path = _state_path(self.partial, done - 1)
        try:
            state: dict[str, Any] = json.loads(path.read_bytes().decode("utf-8", "surrogateescape"))
            if len(state["planned"]) != done:
                raise ValueError(f"{len(state['planned'])} planned shards for {done} done")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DestinationError(
                f"cannot resume {str(self.partial)!r}: its pack state {path.name} is missing or "
                f"damaged ({exc}); pack again without resume (overwrite=True) to start over"
            ) from None
        return state

    def _stale_shards(self, done: int) -> list[Path]:
        """Shard files past the ``done`` ones (a shard a kill cut short: shards are written one
        after the other, so only the next one can be there)."""
        path = self.partial / shard_name(done, self.fmt.Writer.SHARD_SUFFIX)
        return [path] if path.is_file() and not path.is_symlink() else []

    def _before_checkpoint(self) -> None:
        """Record where the inputs stand once this shard is durable (before its checkpoint,
        so a complete checkpoint always has its state)."""
        assert self._fields is not None
        state = {
            "next": list(self.position),
            "planned": self._planned,
            "fields": [self._fields[n].to_dict() for n in sorted(self._fields)],
            "files": self._source.files,
            "bytes": self._source.total_bytes,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self._source.skipped],
            "left_out": self.left_out,
        }
        _write_durable(_state_path(self.partial, len(self._planned) - 1), state)

    def _publish(self) -> Manifest:
        """Publish the dataset; a part (``part=``) instead keeps its checkpoints and records
        ``part.json`` for ``packer merge`` (the manifest returned is then the part's, in memory
        only)."""
        if self._part is None:
            return super()._publish()
        record = {
            **self._part,
            "options": self._options() if self._fields is not None else None,
            "shards": len(self._done),
            "files": self._source.files,
            "bytes": self._source.total_bytes,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self._source.skipped],
            "left_out": self.left_out,
        }
        _write_durable(self.partial / PART_MANIFEST, record)
        publish(self.partial, self.dst)
        return _manifest(record, self._done)

    def skip(self, where: str, reason: str) -> None:
        """List an input that failed (``fn`` raised, a value its field cannot take)."""
        self._source.skipped.append(SkippedInput(where, reason))

    def check_key(self, key: str) -> None:
        """Refuse a key that is not plain, not UTF-8, or written before (a PackerError)."""
        self._key({"__key__": key})

    def append(self, key: str, encoded: dict[str, bytes]) -> None:
        """Add one sample encoded elsewhere, its key already checked (:meth:`check_key`)."""
        self._append(key, encoded)
