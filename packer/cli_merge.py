"""``packer merge``: join the parts written by ``packer convert --part I/N`` into one dataset."""

from __future__ import annotations

from pathlib import Path

import click

from packer.cliutil import CONTEXT, friendly

__all__ = ["merge"]


@click.command(context_settings=CONTEXT)
@click.argument("dst", type=click.Path(path_type=Path))
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace DST (a folder packer wrote, never other data) once the merge is complete.",
)
@friendly
def merge(dst: Path, overwrite: bool) -> None:
    """Join DST.part-0 ... DST.part-{N-1} (from packer convert SRC DST --part I/N) into DST:
    the same bytes as one conversion. Refuses a missing, incomplete or mismatched part.

    \b
    Example:
      packer convert imagenet/train train.lmdb --part 0/2   # on one node
      packer convert imagenet/train train.lmdb --part 1/2   # on another
      packer merge train.lmdb
    """
    from packer.merge import merge as run

    click.echo(run(dst, overwrite=overwrite).summary())
