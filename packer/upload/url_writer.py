"""``packer.Writer`` to a URL as well: staged and uploaded as ``convert`` to a URL is.

A local ``dst`` is :class:`packer.write.writer.Writer` itself. For ``s3://bucket/out.lmdb`` the
dataset is built by that same writer in the URL's staging folder
(:func:`packer.upload.staging.staging_folder`, held locked); each shard, once checkpointed, is
sent by :class:`packer.upload.stream.ShardStream` and its staged copy released, and ``close()``
uploads the tables and the manifest last (:class:`packer.upload.uploader.Uploader`), as
:func:`packer.upload.staging.convert_to_url` does. A failure or a kill before the end leaves no
manifest at the URL: no dataset there. The thin functions below are the public doors to the
staging module's own steps (not duplicated here).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from packer.core.manifest import Manifest
from packer.remote.storage import is_url
from packer.upload import staging as _staging
from packer.upload.stream import ShardStream, stream_limit
from packer.upload.uploader import JOURNAL_NAME, Journal, Uploader
from packer.write.plan import DEFAULT_SHARD_SIZE
from packer.write.result import ConvertResult
from packer.write.writer import DEFAULT_JPEG_QUALITY
from packer.write.writer import Writer as LocalWriter

__all__ = ["Writer", "dataset_name", "held_staging", "upload_staged"]


def dataset_name(url: str) -> str:
    """The dataset's folder name of ``url`` (``out.lmdb``), checked."""
    return _staging._name_of(url)


def held_staging(url: str, staging: Any, options: dict[str, Any]) -> Any:
    """The staging folder of ``url``, held (locked) by one writer while the context lasts."""
    return _staging._staged(url, staging, options)


def start_upload(folder: Path, journal: Journal, url: str) -> None:
    """A new upload into ``folder``: what an earlier one left removed, its journal reset."""
    _staging._clear(folder, keep=(_staging._LOCK, _staging._MARK, JOURNAL_NAME))
    journal.reset(url.rstrip("/"))


def upload_staged(
    result: ConvertResult, uploader: Uploader, local: Path, url: str, overwrite: bool,
    progress: bool, stream: ShardStream,
) -> ConvertResult:  # fmt: skip
    """Upload the published ``local`` (its shards already streamed), the manifest last."""
    return _staging._upload(result, uploader, local, url, overwrite, progress, False, stream)


class Writer(LocalWriter):
    """Write samples into a new dataset at a path or a URL; a context manager.

    Every argument is :class:`packer.write.writer.Writer`'s; for a URL (``s3://bucket/out.lmdb``)
    ``storage_options`` are the store's fsspec options and ``staging`` the staging root
    (:func:`packer.upload.staging.staging_root`). The staging folder holds about four shards
    waiting for their upload plus the one being written.
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
        progress: bool = False,
        staging: str | os.PathLike[str] | None = None,
    ) -> None:
        self._url: str | None = None
        if not is_url(dst):
            super().__init__(
                dst, fields=fields, shard_size=shard_size, overwrite=overwrite,
                storage_options=storage_options, jpeg_quality=jpeg_quality, progress=progress,
            )  # fmt: skip
            return
        url, options = str(dst).rstrip("/"), dict(storage_options or {})
        name = dataset_name(url)
        self._configure(name, fields, shard_size, jpeg_quality, progress)
        self.name, self._overwrite, self._show = url, overwrite, progress
        self._stack = contextlib.ExitStack()
        with self._cleanup_on_error():
            folder = self._stack.enter_context(held_staging(url, staging, options))
            journal = Journal(folder / JOURNAL_NAME)
            self._uploader = Uploader(url, options, journal, False)
            self._uploader.check(overwrite, folder / name)  # before anything is written
            start_upload(folder, journal, url)
            limit = stream_limit(self.shard_size)
            self._stream = ShardStream(self._uploader, folder / name, limit, overwrite)
            self._stack.callback(self._stream.close)
            self.after_shard, self.on_event = self._stream.after_shard, self._stream.on_event
            self._begin(folder / name, overwrite=True)  # the staged copy is ours alone
        self._url = url

    @contextlib.contextmanager
    def _cleanup_on_error(self) -> Iterator[None]:
        try:
            yield
        except BaseException:
            self._stack.close()
            raise

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
                result,
                self._uploader,
                self.dst,
                self._url,
                self._overwrite,
                self._show,
                self._stream,
            )
        self._stack.close()
        return manifest

    def abort(self) -> None:
        """Stop without publishing: nothing appears at the URL (no manifest is uploaded)."""
        super().abort()
        if self._url is not None:
            self._stack.close()
