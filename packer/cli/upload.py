"""The options of ``packer convert`` and ``packer merge`` that write to a URL
(``s3://bucket/out.lmdb``): the destination kind, ``--staging``, ``--keep-staging``,
``--storage-option``; the library work is :mod:`packer.upload.staging`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from packer.cli.util import Decorator, flag, storage_option

__all__ = ["OutputPath", "convert_with", "kept_in", "upload_kwargs", "upload_options"]

STAGING_HELP = (
    "With a URL DST: the local folder the output is built in (default: "
    "$PACKER_CACHE_DIR/staging, else ~/.cache/packer/staging), removed after the upload. "
    "Each shard is sent as soon as it is written and its staged copy freed, so it holds about "
    "--staging-limit plus two shards (with --dask, plus twice the cluster's threads); with "
    "--keep-staging it holds the whole output (about the source's size; ~10x more for .bmp). "
    "--dask and --part on several nodes need one all of them share."
)
LIMIT_HELP = (
    "With a URL DST: how many bytes of finished shards may wait for their upload before the "
    "conversion waits for it (e.g. 4GB; default: four shards)."
)


class OutputPath(click.ParamType):
    """A destination: a URL (``s3://...``; kept as text) or a local path (a ``Path``)."""

    name = "PATH|URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from packer.remote.storage import is_url

        if is_url(value):
            return str(value)
        return click.Path(path_type=Path).convert(value, param, ctx)


class SourcePath(OutputPath):
    """A conversion's source: a URL of WebDataset tars (kept as text) or a local path."""


def upload_options(streams: bool = False) -> Decorator:
    """``--staging DIR``, ``--keep-staging`` and ``--storage-option KEY=VALUE`` (and for a
    command that sends shards while converting, ``--staging-limit SIZE``)."""

    def decorate(func: Any) -> Any:
        func = storage_option()(func)
        if streams:
            func = click.option("--staging-limit", metavar="SIZE", help=LIMIT_HELP)(func)
        func = flag("--keep-staging", text="Keep the staged output after the upload.")(func)
        staging = click.option(
            "--staging", type=click.Path(file_okay=False, path_type=Path), help=STAGING_HELP
        )
        return staging(func)

    return decorate


def upload_kwargs(
    dst: Any,
    staging: Path | None,
    keep_staging: bool,
    storage_options: dict[str, Any],
    staging_limit: str | None = None,
    src: Any = None,
) -> dict[str, Any]:
    """The keyword arguments of a conversion into ``dst``: the upload's for a URL; none for a
    local path, where the upload options are refused (``--storage-option`` is a URL
    ``src``'s then)."""
    if isinstance(dst, str):
        given_limit = {"staging_limit": staging_limit} if staging_limit is not None else {}
        return {
            "storage_options": storage_options,
            "staging": staging,
            "keep_staging": keep_staging,
            **given_limit,
        }
    named = (("--staging", staging), ("--keep-staging", keep_staging))
    given = [n for n, v in (*named, ("--staging-limit", staging_limit)) if v]
    given += ["--storage-option"] * bool(storage_options and not isinstance(src, str))
    if given:
        raise click.UsageError(
            f"{given[0]} applies to a URL destination (s3://bucket/out.lmdb), not the local "
            f"path {str(dst)!r}: drop it, or give a URL"
        )
    return {}


def kept_in(dst: Any, part: tuple[int, int] | None, staging: Path | None, options: Any) -> str:
    """Where an interrupted conversion into ``dst`` keeps its work (without ``.partial``)."""
    from packer.write.tasks import part_path

    if isinstance(dst, str):
        from packer.upload.staging import staging_folder

        dst = staging_folder(dst, staging, options) / dst.rstrip("/").rsplit("/", 1)[-1]
    return str(part_path(dst, part[0]) if part else dst)


def convert_with(src: Any, dst: Any, options: Any, uploads: dict[str, Any]) -> Any:
    """Convert ``src`` into ``dst`` with ``options`` (a ``ConvertOptions``): through
    :func:`packer.upload.staging.convert_to_url` for a URL (with the ``uploads`` options, and
    ``options`` as its keywords), else :func:`packer.write.convert.convert`."""
    if isinstance(dst, str):
        from packer.upload.staging import convert_to_url

        return convert_to_url(src, dst, **options.keywords(), **uploads)
    from packer.write.convert import convert

    return convert(src, dst, options=options, **uploads)
