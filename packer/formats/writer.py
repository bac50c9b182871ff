"""What every format's writer shares: the :class:`Writer` contract and :class:`WriterBase`
(shards rolled in order, per-sample files made durable with their folders)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

from packer.core.manifest import ShardInfo, file_checksum, shard_name
from packer.formats.files import DurableFiles

__all__ = ["Writer", "WriterBase", "WriterFactory"]


class Writer(Protocol):
    """Writes samples' records, in order, into one format's files; a context manager."""

    def __enter__(self) -> Writer: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def write(self, shard: int, key: str, records: Sequence[bytes]) -> list[int]:
        """Store one sample's records in planned ``shard``; return each record's offset."""
        ...

    def finish_shard(self) -> ShardInfo | None:
        """Make everything written since the last call durable; the shard's entry, if any."""
        ...


WriterFactory = Callable[[Path, Sequence[int], str, str], Writer]


class WriterBase:
    """What every format's writer shares: where it writes, the planned shards' bytes, the
    layout and kind; being a context manager that, on leaving, drops what is still open without
    making it durable (a failed run redoes that shard); rolling to the next shard (the open one
    made durable first); and the manifest entry of the shard just closed.

    A format adds ``write``, ``finish_shard``, its own state in ``_fresh``, and where it has
    shards ``SHARD_SUFFIX``, ``_open_shard`` and ``_discard``.
    """

    SHARD_SUFFIX = ""

    def __init__(
        self, root: Path, planned_shard_bytes: Sequence[int], layout: str, kind: str
    ) -> None:
        self.root = Path(root)
        self.planned = list(planned_shard_bytes)
        self.per_sample = layout == "per-sample"
        self.kind = kind
        self.files = DurableFiles(self.root)  # per-sample files, fsync'd with their folders
        self._current = -1  # the open planned shard (or the last one closed)
        self._fresh()

    def _fresh(self) -> None:
        """Set up the format's own state (the last step of ``__init__``)."""

    def __enter__(self) -> WriterBase:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._discard()

    def _discard(self) -> None:
        """Close what is open without making it durable."""

    def _open_shard(self, shard: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} writes no shards")

    def finish_shard(self) -> ShardInfo | None:
        raise NotImplementedError

    def _roll(self, shard: int) -> None:
        """Before a sample of planned ``shard``: if another shard is open, finish it (durably),
        then open ``shard``."""
        if shard != self._current:
            self.finish_shard()
            self._open_shard(shard)
            self._current = shard

    def _shard_path(self) -> Path:
        return self.root / shard_name(self._current, self.SHARD_SUFFIX)

    def _shard_entry(self, count: int) -> ShardInfo:
        """The manifest entry of the open shard's file, closed and fsync'd, holding ``count``
        records."""
        path = self._shard_path()
        return ShardInfo(path.name, count, path.stat().st_size, file_checksum(path))
