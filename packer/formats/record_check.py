"""The one check of records against the record table: each record read is compared with its
xxh3 (``records.npy``'s ``checksum``), composed around any reader.

:class:`RecordCheck` says how a reader recovers from a record that differs: how many reads in
all (``attempts``), how the records that differ are read again (:meth:`RecordCheck.again`: a
ranged GET repeated, a cached shard downloaded again) and the error raised once they still
differ (:meth:`RecordCheck.refused`), never the wrong bytes. :class:`CheckedReader` wraps any
reader's ``read_many``/``read_into`` with one; the readers at a URL check every record so
(``packer.remote``), a local dataset when opened with ``check_records=True``
(:class:`LocalCheck`: read once, then refused, naming the sample, its file and
``packer verify``). Cost: one xxh3 per record read (see ``benchmarks/check_records.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from packer.core.fields import record_matches
from packer.errors import FormatError
from packer.formats.base import ReaderBase, RecordReads
from packer.formats.bmp import record_name

__all__ = ["CheckedReader", "LocalCheck", "RecordCheck", "check_records"]


def check_records(
    expected: np.ndarray,
    out: list[Any],
    again: Callable[[list[int], int], list[bytes]],
    failed: Callable[[list[int], int], Exception],
    attempts: int,
) -> list[int]:
    """``out[j]`` (bytes or a view) against ``expected[j]``, the record table's xxh3; those
    that differ are read again (``again(positions, attempt)`` gives their new bytes, put in
    ``out``), up to ``attempts`` reads in all; then ``failed(positions, attempts)`` is raised,
    never the wrong bytes. Returns the positions read again."""
    want = expected.tolist()
    redone: list[int] = []
    for attempt in range(1, attempts + 1):
        bad = [j for j, data in enumerate(out) if not record_matches(data, want[j])]
        if not bad:
            return redone
        if attempt == attempts:
            raise failed(bad, attempt)
        redone.extend(j for j in bad if j not in redone)
        for j, data in zip(bad, again(bad, attempt)):
            out[j] = data
    return redone


class RecordCheck:
    """How a reader's records are checked: ``digests`` and ``lengths`` are the record table's
    columns; a subclass says how a record that differs is read again and what is raised."""

    attempts = 1  # reads in all before the error

    def __init__(self, digests: np.ndarray, lengths: np.ndarray) -> None:
        self.digests = digests
        self.lengths = lengths

    def again(self, records: np.ndarray, attempt: int) -> list[bytes]:
        """Records ``records`` read anew after read ``attempt`` found them different."""
        raise NotImplementedError

    def refused(self, records: np.ndarray, attempt: int) -> Exception:
        """The error for ``records``, still different after ``attempt`` reads."""
        raise NotImplementedError

    def many(self, rec: np.ndarray, out: list[Any]) -> list[int]:
        """Records ``rec`` read as ``out`` checked (those read again replaced in ``out``);
        the positions read again."""
        if not len(rec):
            return []
        return check_records(
            self.digests[rec],
            out,
            lambda bad, attempt: self.again(rec[bad], attempt),
            lambda bad, attempt: self.refused(rec[bad], attempt),
            self.attempts,
        )

    def into(self, rec: np.ndarray, buffer: Any, dest: np.ndarray) -> None:
        """Records ``rec`` copied into ``buffer`` at ``dest`` checked there; one read again is
        copied over its place."""
        where, lengths = dest.tolist(), self.lengths[rec].tolist()
        views = [buffer[w : w + n] for w, n in zip(where, lengths)]
        for j in self.many(rec, views):
            buffer[where[j] : where[j] + lengths[j]] = views[j]


class CheckedReader(RecordReads):
    """``reader`` with every record it serves checked by ``check`` (:meth:`read_many`,
    :meth:`read_into`, :meth:`read`); anything else is the reader's own."""

    def __init__(self, reader: ReaderBase, check: RecordCheck) -> None:
        self.reader = reader
        self.check = check

    def _read_many(self, rec: np.ndarray) -> list[bytes]:
        out = self.reader.read_many(rec)
        self.check.many(rec, out)
        return out

    def _read_into(self, rec: np.ndarray, out: memoryview, dest: np.ndarray) -> None:
        self.reader.read_into(rec, out, dest)
        self.check.into(rec, out, dest)

    def __getattr__(self, name: str) -> Any:
        reader = self.__dict__.get("reader")  # absent while unpickled
        if reader is None:
            raise AttributeError(name)
        return getattr(reader, name)


class LocalCheck(RecordCheck):
    """A local dataset's check (``check_records=True``): a record that differs is refused at
    once (the file on the disk is what a second read would give), naming its sample, the file
    and ``packer verify``. ``first`` is the sample table's column (a record's sample),
    ``format`` the dataset's (BMP stores a file per record)."""

    def __init__(
        self, reader: ReaderBase, records: np.ndarray, first: np.ndarray, format: str
    ) -> None:
        super().__init__(records["checksum"], records["length"])
        self.reader = reader
        self.first = first
        self.whole_files = format == "bmp"

    def file_of(self, record: int) -> Path:
        """The file record ``record`` is stored in."""
        r, file = self.reader, int(self.reader.file[record])
        if r.layout == "shards":
            return r.root / r.shard_names[file]
        if self.whole_files:
            return r.root / record_name(r.keys[file], r.kind, int(r.offset[record]))
        return r.root / (r.keys[file] + str(getattr(r, "SAMPLE_SUFFIX", "")))

    def refused(self, records: np.ndarray, attempt: int) -> Exception:  # noqa: ARG002
        record = int(records[0])
        sample = int(np.searchsorted(self.first, record, side="right")) - 1
        root = self.reader.root
        more = f" (and {len(records) - 1} more records of this read)" if len(records) > 1 else ""
        what = "shard" if self.reader.layout == "shards" else "file"
        return FormatError(
            f"sample {sample} ({self.reader.keys[sample]!r}) of {str(root)!r}: record {record} "
            f"read from {str(self.file_of(record))!r} differs from its xxh3 in the record "
            f"table{more}: the {what} differs from the table (damaged on the disk, or changed "
            f"after the conversion), so it is not served. Run `packer verify {root}` to list "
            "every damaged sample, then convert again"
        )
