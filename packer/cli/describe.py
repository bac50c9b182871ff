"""``packer inspect``: what a packed dataset (a folder or a URL) holds."""

from __future__ import annotations

import json
from typing import Any

import click

from packer.cli.util import CONTEXT, DatasetPath, flag, friendly, json_flag, storage_option

__all__ = ["inspect"]


@click.command(context_settings=CONTEXT)
@click.argument("dst", type=DatasetPath())
@flag("--skipped", text="List every skipped input with its reason.")
@click.option("--keys", "num_keys", default=5, show_default=True, help="How many keys to show.")
@json_flag("Print the facts as one JSON object.")
@storage_option()
@friendly
def inspect(dst: Any, skipped: bool, num_keys: int, as_json: bool, storage_options: Any) -> None:
    """Show what a packed dataset holds: format, counts, classes, shards, keys, skipped inputs.

    \b
    Example:
      packer inspect train.lmdb --skipped
      packer inspect s3://bucket/train.npy --storage-option endpoint_url=http://host:9000
    """
    from packer.core.manifest import load_manifest
    from packer.read.describe import describe, inspect_dict
    from packer.remote.opener import url_manifest
    from packer.write.splits import describe_splits

    options = storage_options or None
    if as_json:
        click.echo(json.dumps(inspect_dict(dst, options), indent=2))
        return
    top = url_manifest(dst, options) if isinstance(dst, str) else load_manifest(dst)
    if top.kind == "splits":
        click.echo(describe_splits(dst, top))
        return
    if isinstance(dst, str):  # a URL: the description of its tables
        click.echo(describe(dst, skipped, num_keys, options))
        return
    click.echo(describe(dst, show_skipped=skipped, num_keys=num_keys))
    if load_manifest(dst).kind == "video":
        from packer.read.describe_video import describe_video

        click.echo(describe_video(dst))
