"""``packer.Writer`` to a URL as well: staged and uploaded as ``convert`` to a URL is.

A local ``dst`` is :class:`packer.write.writer.Writer` itself. For ``s3://bucket/out.lmdb`` the
dataset is built by that same writer in the URL's staging folder
(:func:`packer.upload.staging.held_staging`, held locked); each shard, once checkpointed, is
sent by :class:`packer.upload.stream.ShardStream` and its staged copy released, and ``close()``
uploads the tables and the manifest last (:func:`packer.upload.staging.upload_staged`), as
:func:`packer.upload.staging.convert_to_url` does. A failure or a kill before the end leaves no
manifest at the URL: no dataset there. A full staging disk is told what streaming holds, by
the estimate ``convert`` to a URL gives (:mod:`packer.write.writer_source`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from packer.core.manifest import Manifest
from packer.errors import DestinationError, PackerError
from packer.remote.storage import is_url
from packer.upload.staging import dataset_name, held_staging, start_upload, upload_staged
from packer.upload.stream import ShardStream, stream_limit
from packer.upload.uploader import JOURNAL_NAME, Journal, Uploader
from packer.write.result import ConvertResult
from packer.write.writer import Writer as LocalWriter

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from packer.write.writer_values import WriterOptions

__all__ = ["Writer"]


class Writer(LocalWriter):
    """Write samples into a new dataset at a path or a URL; a context manager.

    ``options`` are :class:`packer.write.writer.Writer`'s keywords
    (:class:`packer.write.writer_values.WriterOptions`: ``fields``, ``shard_size``,
    ``overwrite``, ``storage_options``, ``jpeg_quality``, ``check``, ``progress``); for a URL
    (``s3://bucket/out.lmdb``) ``storage_options`` are the store's fsspec options and
    ``staging`` the staging root (:func:`packer.upload.staging.staging_root`). The staging
    folder holds about four shards waiting for their upload plus the one being written.
    """

    def __init__(
        self,
        dst: str | os.PathLike[str],
        *,
        staging: str | os.PathLike[str] | None = None,
        **options: Unpack[WriterOptions],
    ) -> None:
        self._url: str | None = None
        self._staging = staging
        super().__init__(dst, **options)

    def _open(self, dst: Any, overwrite: bool, storage_options: dict[str, Any] | None) -> None:
        """A URL: hold its staging folder, check the store, start the upload, then write the
        dataset there (a path: the local writer's own start)."""
        if not is_url(dst):
            if self._staging is not None:
                raise PackerError(
                    f"staging= applies to a URL, not the path {os.fspath(dst)!r} (a local "
                    "dataset is written in place)"
                )
            super()._open(dst, overwrite, storage_options)
            return
        url, options = str(dst).rstrip("/"), dict(storage_options or {})
        name = dataset_name(url)
        self.name, self._overwrite = url, overwrite
        self._stack = contextlib.ExitStack()
        with self._cleanup_on_error():
            folder = self._stack.enter_context(held_staging(url, self._staging, options))
            journal = Journal(folder / JOURNAL_NAME)
            self._uploader = Uploader(url, options, journal, False)
            self._uploader.check(overwrite, folder / name)  # before anything is written
            start_upload(folder, journal, url)
            limit = stream_limit(self.shard_size)
            self._stream = ShardStream(self._uploader, folder / name, limit, overwrite)
            self._stack.callback(self._stream.close)
            self.after_shard, self.on_event = self._stream.after_shard, self._stream.on_event
            self._streamed = (limit, self.shard_size)  # a full disk: what streaming holds
            self._begin(folder / name, overwrite=True)  # the staged copy is ours alone
        self._url = url

    @contextlib.contextmanager
    def _cleanup_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self._stack.close()
            raise

    def _storage_error(self, exc: OSError) -> PackerError:
        """The local writer's error; on a full staging disk, also where staging is and how to
        move it (as ``convert`` to a URL says it)."""
        error = super()._storage_error(exc)
        if self._url is None or not str(error).startswith("disk full"):
            return error
        return DestinationError(
            f"{error} (this is the local staging folder of the upload to {self._url!r}; the "
            "space needed there is four shards waiting for their upload plus two being written "
            "and their checkpoints: choose a disk with room with staging=DIR, or a smaller "
            "shard_size)"
        )

    def close(self) -> Manifest:
        """Publish the dataset (for a URL: upload what is left, the manifest last)."""
        if self._url is None or self._state != "open":
            return super().close()
        with self._cleanup_on_error():
            manifest = super().close()
            self._stream.drain()
            result = ConvertResult(
                dst=self.dst, manifest=manifest, seconds=0, bytes_in=0, bytes_out=0
            )
            upload_staged(
                result, self._uploader, self.dst, self._url, self._overwrite,
                not self._bar.disable, False, self._stream,
            )  # fmt: skip
        self._stack.close()
        return manifest

    def abort(self) -> None:
        """Stop without publishing: nothing appears at the URL (no manifest is uploaded)."""
        super().abort()
        if self._url is not None:
            self._stack.close()
