"""Samples from the user's own code, written one at a time into a dataset with fields.

The result is what ``packer convert`` makes of key-grouped files holding the same bytes (the
same shards, tables and keys, byte for byte): each value is encoded at :meth:`Writer.write`
(:mod:`packer.write.writer_values`) and kept until its shard is full (the rule of
:func:`packer.write.pipeline.plan_shards`); the shard is then written by the storage core, made
durable and checkpointed in ``DST.partial/`` by the pipeline's own ``store_sample`` and
``end_shard``, and leaves the process: memory holds about one shard. :meth:`Writer.close` writes
the last shard, the tables and the manifest (``finalize``) and publishes ``DST``; an exception
inside the ``with`` (or a kill) leaves ``DST.partial`` and no dataset.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from tqdm.auto import tqdm

from packer.core.fields import ABSENT, MAX_FIELDS, FieldSpec, field_kind
from packer.core.manifest import Manifest, bytes_checksum
from packer.core.sizes import parse_size
from packer.decode.check import DEFAULT_MAX_PIXELS
from packer.errors import DestinationError, InputFileError, PackerError
from packer.formats import format_for
from packer.remote.storage import is_url
from packer.source.samples import FieldSample
from packer.write.destination import (
    DestinationLock,
    check_destination,
    lock_holder,
    partial_path,
    publish,
)
from packer.write.loading import Loaded
from packer.write.pipeline import Event, Job, ShardHook, end_shard, finalize, store_sample
from packer.write.plan import DEFAULT_SHARD_SIZE
from packer.write.resume import Checkpoint, Progress, Rows, unstarted
from packer.write.writer_source import WrittenSource, is_disk_full, writer_disk_full
from packer.write.writer_values import (
    DEFAULT_CHECK,
    DEFAULT_JPEG_QUALITY,
    Check,
    check_check,
    check_jpeg_quality,
    declared_fields,
    encode_fields,
    sample_key,
)

__all__ = ["DEFAULT_CHECK", "DEFAULT_JPEG_QUALITY", "Writer", "WrittenSource"]


class Writer:
    """Write samples (dicts of fields) into a new dataset at ``dst``; a context manager.

    Args:
        dst: the dataset to create; its suffix picks the format (``.lmdb``, ``.npy``,
            ``.h5``/``.hdf5``). It is built in ``DST.partial`` and appears only when complete.
        fields: the field names, declared up front (default: those of the first shard's
            samples). A sample may lack a field (it reads as ``None``); a field not declared
            is refused.
        shard_size: roll to a new shard past this many bytes (``"256MB"``, an int); also the
            most the writer holds in memory.
        overwrite: replace an existing dataset at ``dst`` (only once the new one is complete).
        storage_options: for a URL ``dst``, which ``packer.Writer``
            (:class:`packer.upload.url_writer.Writer`) writes.
        jpeg_quality: the quality pixels are encoded at in a ``jpg``/``jpeg`` field (1-100).
        check: how bytes given for an image (or audio) field are checked at ``write()``, as
            by ``packer convert --check``: ``"scan"`` (default: the header, a JPEG's end marker
            and its whole compressed stream, by a 1/8-scale decode, ~1 ms a photo), ``"fast"``
            (header and end marker, ~0.01 ms: catches truncated files and non-images, misses
            most corrupt headers and all corrupt scan data a reader fails on; docs/writing.md)
            or ``"decode"``. Use ``"fast"`` for bytes you trust; pixels need no check.
        progress: show a tqdm bar of the samples written.

    Raises:
        PackerError: bad arguments, or a destination that exists (without ``overwrite``), that
            another process is writing, or that cannot be created.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        *,
        fields: Iterable[str] | None = None,
        shard_size: int | str = DEFAULT_SHARD_SIZE,
        overwrite: bool = False,
        storage_options: dict[str, Any] | None = None,
        jpeg_quality: int = DEFAULT_JPEG_QUALITY,
        check: Check = DEFAULT_CHECK,
        progress: bool = False,
    ) -> None:
        self._configure(dst, fields, shard_size, jpeg_quality, check, progress)
        self._open(dst, overwrite, storage_options)

    def _open(self, dst: Any, overwrite: bool, storage_options: dict[str, Any] | None) -> None:
        """Start writing at the local ``dst`` (the URL writer overrides it for a URL)."""
        if is_url(dst):
            raise DestinationError(
                f"this Writer writes a local folder, not the URL {dst!r}: use packer.Writer "
                "(packer.upload.url_writer.Writer), which stages and uploads it"
            )
        if storage_options:
            raise PackerError(f"storage_options apply to a URL, not the path {os.fspath(dst)!r}")
        self._begin(Path(os.fspath(dst).rstrip("/") or "/"), overwrite)

    def _configure(
        self, dst: Any, fields: Any, shard_size: Any, jpeg_quality: Any, check: Any, progress: bool
    ) -> None:
        """Check the arguments (before anything is touched)."""
        self.name = os.fspath(dst)
        self.fmt = format_for(self.name.rstrip("/"))
        if "shards" not in self.fmt.LAYOUTS:
            raise PackerError(
                f"{self.fmt.NAME.upper()} stores one decoded image per file: a Writer writes "
                ".lmdb, .npy or .h5"
            )
        self.shard_size = parse_size(shard_size)
        try:
            self.jpeg_quality = check_jpeg_quality(jpeg_quality)
        except InputFileError as exc:
            raise PackerError(str(exc)) from None
        self.check = check_check(check)
        self._fields = declared_fields(fields)  # fixed once the first shard is written
        self._declared = self._fields is not None
        self._seen: dict[str, FieldSpec] = {}  # the first shard's fields, while it fills
        self._buffer: list[tuple[str, dict[str, bytes]]] = []
        self._buffer_bytes = 0
        self._largest = 0  # the largest sample's bytes (a full disk's estimate)
        self._streamed: tuple[int, int] | None = None  # a URL's upload: (limit, shard size)
        self._keys: set[str] = set()  # casefolded: keys differing only by case are refused
        self._planned: list[int] = []
        self._done: list[Checkpoint] = []
        self._bar = tqdm(unit="samples", desc=f"write → {self.fmt.NAME}", disable=not progress)
        self._state = "new"
        self.manifest: Manifest | None = None
        self.after_shard: ShardHook | None = None  # a URL's upload, set before _begin
        self.on_event: Event | None = None

    def _begin(self, dst: Path, overwrite: bool) -> None:
        """Check ``dst``, take its lock, start ``DST.partial``."""
        self.dst, self.partial = dst, partial_path(dst)
        self._refuse_partial(overwrite)
        self._check_destination(overwrite)
        self._lock = DestinationLock(dst)
        self._lock.__enter__()
        try:
            self._start(overwrite)
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        self._state = "open"

    def _refuse_partial(self, overwrite: bool) -> None:
        """A ``DST.partial`` no live process writes (a failed or killed run) is kept unless
        ``overwrite``: a Writer does not resume."""
        if overwrite or lock_holder(self.dst) is not None or not self.partial.exists():
            return
        if not unstarted(self.partial):
            raise DestinationError(
                f"{str(self.partial)!r} holds an interrupted write or conversion (no process is "
                "writing it); pass overwrite=True to start over (a Writer does not resume)"
            )

    def _check_destination(self, overwrite: bool) -> None:
        check_destination(self.dst, overwrite)

    def _start(self, overwrite: bool) -> None:
        self._check_destination(overwrite)  # again, under the lock
        self._refuse_partial(overwrite)
        if self.partial.exists():
            shutil.rmtree(self.partial)
        self.partial.mkdir()
        self._setup()
        self._progress.start(self._fingerprint())

    def _fingerprint(self) -> dict[str, Any]:
        """What ``DST.partial/_progress/fingerprint.json`` records (a Writer does not resume)."""
        return {"format": self.fmt.NAME, "options": {}, "root": "packer.Writer"}

    def _setup(self) -> None:
        """The manifest's source, the progress folder and the storage core's job."""
        self._source = WrittenSource(fields=[])
        self._progress = Progress(self.partial)
        self._job = Job(
            fmt=self.fmt,
            layout="shards",
            partial=self.partial,
            source=self._source,
            loader=Loaded,  # unused: samples come encoded
            cpu_bound=False,
            shard_size=self.shard_size,
            workers=1,
            strict=True,  # nothing is skipped silently
            progress=False,
            unit="samples",
            on_event=self.on_event,
            after_shard=self.after_shard,
        )

    def __enter__(self) -> Writer:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is None:
            self.close()
        else:
            self.abort()

    @property
    def fields(self) -> list[str]:
        """The field names, sorted (as the dataset stores them): fixed ones, or those seen."""
        return sorted(self._fields if self._fields is not None else self._seen)

    def __len__(self) -> int:
        """Samples written so far."""
        return len(self._keys)

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample: ``{"__key__": "0001", "jpg": ..., "txt": ...}``.

        Raises:
            PackerError: naming the key and the field: a value its field cannot take, a key
                written before, a ``__key__`` missing or not a plain name, a field name that is
                not plain or not declared. The samples written so far are kept.
        """
        if self._state != "open":
            raise PackerError(
                f"this Writer of {self.name!r} is {self._state}: nothing more is written"
            )
        key = self._key(sample)
        declared = self._fields if self._declared else None
        self._append(key, encode_fields(key, sample, declared, self.jpeg_quality, self.check))

    def _append(self, key: str, encoded: dict[str, bytes]) -> None:
        """Buffer one checked sample's encoded fields (the shard before it written first if
        this one starts the next)."""
        size = sum(map(len, encoded.values()))
        starts_shard = bool(self._buffer) and self._buffer_bytes + size > self.shard_size
        self._check_new_fields(key, encoded, starts_shard)
        if starts_shard:
            self._flush()
        if self._fields is None:  # the first shard: its samples' fields are the dataset's
            for name in encoded.keys() - self._seen.keys():
                self._seen[name] = FieldSpec(name, field_kind(name))
        self._buffer.append((key, encoded))
        self._buffer_bytes += size
        self._largest = max(self._largest, size)
        self._keys.add(key.casefold())
        self._bar.update(1)

    def _check_new_fields(self, key: str, encoded: dict[str, bytes], starts_shard: bool) -> None:
        """Refuse a field the first shard's samples lack once that shard is written (or is
        about to be: this sample starts the next one)."""
        known = self._fields if self._fields is not None else self._seen if starts_shard else None
        if known is None or encoded.keys() <= known.keys():
            return
        new = [n for n in encoded if n not in known]
        if new:
            raise InputFileError(
                f"sample {key!r}, field {new[0]!r}: a new field, after the first shard was "
                f"written with fields {', '.join(sorted(known or {})) or '(none)'}; declare "
                "every field up front with Writer(..., fields=[...])"
            )

    def _key(self, sample: Any) -> str:
        key = sample_key(sample, len(self) + 1)
        if key.casefold() in self._keys:
            raise InputFileError(
                f"sample {key!r}, field '__key__': a key written before (keys are unique, also "
                "ignoring case)"
            )
        return key

    def _flush(self) -> None:
        """Write the buffered samples as the next shard, durably, and checkpoint it."""
        if not self._buffer:
            return
        if self._fields is None:
            if len(self._seen) > MAX_FIELDS:
                raise PackerError(f"{len(self._seen)} distinct field names, more than {MAX_FIELDS}")
            self._fields = dict(self._seen)
        specs = [self._fields[n] for n in sorted(self._fields)]
        self._source.fields = specs
        shard = len(self._planned)
        self._planned.append(self._buffer_bytes)
        job, buffer = self._job, self._buffer
        self._source.files += len(buffer)
        self._source.total_bytes += self._buffer_bytes
        try:
            with self.fmt.Writer(self.partial, self._planned, "shards", "fields") as writer:
                rows = Rows()
                for key, values in buffer:
                    records = [values.get(s.name, b"") for s in specs]
                    sums = [
                        bytes_checksum(values[s.name]) if s.name in values else ABSENT
                        for s in specs
                    ]
                    store_sample(
                        job,
                        writer,
                        rows,
                        FieldSample(key, key, 0, ()),
                        Loaded(records, checksums=sums),
                        shard,
                    )
                self._before_checkpoint()
                end_shard(job, writer, self._progress, self._done, rows, shard)
        except OSError as exc:
            self._state = "failed"
            raise self._storage_error(exc) from exc
        except BaseException:
            self._state = "failed"
            raise
        self._buffer, self._buffer_bytes = [], 0

    def _storage_error(self, exc: OSError) -> PackerError:
        """The error for a failed write of ``DST.partial``: a full disk says what is needed."""
        if not is_disk_full(exc, self.partial):
            return DestinationError(f"writing {str(self.partial)!r} failed: {exc}")
        return writer_disk_full(
            self.partial,
            self._keys,
            self._source.total_bytes,
            self._largest,
            self._buffer_bytes,
            self._streamed,
        )

    def _before_checkpoint(self) -> None:
        """Called once a shard's samples are written, before its checkpoint (nothing here)."""

    def close(self) -> Manifest:
        """Write the last shard, the tables and the manifest, and publish ``dst``; returns its
        manifest (closing again returns it again).

        Raises:
            PackerError: nothing was written, or the destination could not be written.
        """
        if self._state == "closed" and self.manifest is not None:
            return self.manifest
        if self._state != "open":
            raise PackerError(
                f"this Writer of {self.name!r} is {self._state}: nothing was published"
            )
        try:
            self._flush()
            self.manifest = self._publish()
        except OSError as exc:
            self.abort()
            raise self._storage_error(exc) from exc
        except BaseException:
            self.abort()
            raise
        finally:
            self._bar.close()
        self._state = "closed"
        self._lock.__exit__(None, None, None)
        return self.manifest

    def _publish(self) -> Manifest:
        """Write the tables and the manifest from the checkpoints, then publish ``dst``."""
        if not self._done:
            raise PackerError(f"no sample was written to {self.name!r}: nothing to publish")
        manifest, _ = finalize(self._job, self._done, self._options())
        self._progress.remove()
        publish(self.partial, self.dst)
        return manifest

    def _options(self) -> dict[str, Any]:
        assert self._fields is not None
        return {
            "layout": "shards",
            "shard_size": self.shard_size,
            "check": self.check,
            "max_pixels": DEFAULT_MAX_PIXELS,
            "fields": [self._fields[n].to_dict() for n in sorted(self._fields)],
            "source_kind": "writer",
            "jpeg_quality": self.jpeg_quality,
        }

    def abort(self) -> None:
        """Stop without publishing: ``DST.partial`` keeps the shards written so far (no
        dataset appears; ``overwrite=True`` starts over). An empty one is removed."""
        if self._state in ("closed", "aborted"):
            return
        self._buffer, self._buffer_bytes = [], 0
        self._bar.close()
        if self._state in ("open", "failed"):
            if not self._done and unstarted(self.partial):
                shutil.rmtree(self.partial, ignore_errors=True)
            self._lock.__exit__(None, None, None)
        self._state = "aborted"
