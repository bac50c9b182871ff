"""What a :class:`packer.write.writer.Writer` knows of the samples it was given: the manifest's
view of them (:class:`WrittenSource`), and on a full disk the error saying how much room the
rest needs (:func:`writer_disk_full`).

A Writer cannot tell how many samples are still to come, so a full local disk is told what the
shard being written needs. A URL's writer streams its shards (:func:`packer.write.disk_full.streamed`):
its staging disk is told what streaming holds, by the estimate ``convert`` to a URL gives
(:func:`packer.write.disk_full.disk_full_error`), with the advice a Writer can follow (it does
not resume).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.core.sizes import format_size
from packer.errors import DestinationError
from packer.write.disk_full import disk_full_error, streamed

__all__ = ["WRITER_ADVICE", "WrittenSource", "is_disk_full", "writer_disk_full"]

WRITER_ADVICE = (
    "The shards written so far are kept in DST.partial, but a Writer does not resume: free "
    "space (or choose another destination), then write again with overwrite=True"
)
_TABLES_PER_SAMPLE = 40  # bytes of index, records and keys tables a sample adds (about)


@dataclass
class WrittenSource:
    """The manifest's view of what was written: no source tree, samples given one by one
    (none of them skipped, none listed: ``samples`` is what finalize counts as inputs)."""

    fields: list[Any]
    files: int = 0
    total_bytes: int = 0
    root: str = "packer.Writer"
    kind: str = "fields"
    source_kind: str = "writer"
    classes: list[str] = field(default_factory=list)
    samples: list[Any] = field(default_factory=list)
    skipped: list[Any] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"root": self.root, "files": self.files, "bytes": self.total_bytes}


@dataclass(frozen=True)
class _Given:
    """One sample given, as the disk-full estimate counts inputs: its key and size."""

    key: str
    size: int = 0


@dataclass
class _GivenSoFar:
    """The samples given so far as the estimate of :mod:`packer.write.disk_full` reads a
    source: their keys (one of them the largest sample's size) and their bytes."""

    samples: list[_Given]
    total_bytes: int
    kind: str = "fields"


def is_disk_full(exc: OSError, partial: Path) -> bool:
    """Whether ``exc`` is a full disk (LMDB reports one as EIO: the free space tells)."""
    if exc.errno == errno.ENOSPC:
        return True
    try:
        return shutil.disk_usage(partial.parent).free < (1 << 20)
    except OSError:
        return False


def writer_disk_full(
    partial: Path,
    keys: Iterable[str],
    given: int,
    largest: int,
    pending: int,
    stream: tuple[int, int] | None,
) -> DestinationError:
    """The error for a full disk while a Writer writes ``partial``: ``keys`` and ``given``
    bytes written so far (``largest``: the largest sample's bytes; ``pending``: those of the
    shard being written), ``stream``: the (limit, shard size) of a URL writer's upload."""
    names = list(keys)
    try:
        free = shutil.disk_usage(partial.parent).free
        block = os.statvfs(partial.parent).f_frsize or 4096
    except OSError:
        free, block = 0, 4096
    if stream is not None:  # the samples to come are not known: the next shard stands for them
        samples = [_Given(k, largest if i == 0 else 0) for i, k in enumerate(names)]
        so_far = _GivenSoFar(samples, given + stream[1])
        advice = (
            f"Each shard written from now on also leaves about {format_size(4 * block)} of "
            f"checkpoint until close(). {WRITER_ADVICE}"
        )
        with streamed(*stream):
            return disk_full_error(partial, so_far, advice=advice)
    tables = _TABLES_PER_SAMPLE * len(names) + sum(len(os.fsencode(k)) for k in names)
    need = pending + 8 * block + tables  # the shard, its checkpoint's files, the tables
    return DestinationError(
        f"disk full while writing {str(partial)!r}: about {format_size(need)} more is needed "
        f"(the shard being written, its checkpoint and the tables: what the samples still to "
        f"come need, a Writer cannot tell) and {format_size(free)} is free. {WRITER_ADVICE}"
    )
