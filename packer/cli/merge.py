"""``packer merge``: join the parts written by ``packer convert --part I/N`` into one dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from packer.cli.upload import OutputPath, upload_kwargs, upload_options
from packer.cli.util import CONTEXT, friendly

__all__ = ["merge"]


@click.command(context_settings=CONTEXT)
@click.argument("dst", type=OutputPath())
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace DST (a folder packer wrote, never other data) once the merge is complete.",
)
@upload_options()
@friendly
def merge(
    dst: Any,
    overwrite: bool,
    staging: Path | None,
    keep_staging: bool,
    storage_options: dict[str, Any],
) -> None:
    """Join DST.part-0 ... DST.part-{N-1} (from packer convert SRC DST --part I/N) into DST:
    the same bytes as one conversion. Refuses a missing, incomplete or mismatched part.

    A URL DST joins the parts of packer convert SRC URL --part I/N (in the same --staging
    folder; each part has sent its shards already), then uploads the tables and packer.json,
    last; run it again to resume.

    The parts of packer pack FUNCTION INPUTS DST --part I/N join the same way: the samples
    and keys of one run, in input order.

    \b
    Example:
      packer convert imagenet/train train.lmdb --part 0/2   # on one node
      packer convert imagenet/train train.lmdb --part 1/2   # on another
      packer merge train.lmdb
      packer merge s3://bucket/train.lmdb --staging /shared/staging
    """
    extra = upload_kwargs(dst, staging, keep_staging, storage_options)
    if extra:
        from packer.upload.staging import merge_to_url

        click.echo(merge_to_url(dst, overwrite=overwrite, **extra).summary())
        return
    from packer.write.merge import merge as run

    click.echo(run(dst, overwrite=overwrite).summary())
