"""``packer cache ls`` and ``packer cache clear``: the node's shard cache of remote datasets."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from packer.cli.util import CONTEXT, friendly, json_flag

__all__ = ["cache"]


def _cache_dir() -> Any:
    return click.option(
        "--cache-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="The cache folder (default: $PACKER_CACHE_DIR, else $XDG_CACHE_HOME/packer, "
        "else ~/.cache/packer).",
    )


@click.group(context_settings=CONTEXT)
def cache() -> None:
    """The node-local shard cache that remote datasets are read through (LMDB shards, and
    NPY/HDF5 shards when asked): list it, or clear what no process is reading.

    \b
    Example:
      packer cache ls
      packer cache clear --cache-dir /scratch/packer-cache
    """


@cache.command("ls", context_settings=CONTEXT)
@_cache_dir()
@json_flag("Print one JSON object (the folder, entries, total bytes).")
@friendly
def ls(cache_dir: Path | None, as_json: bool) -> None:
    """List the cached objects, most recently used first: size, last use, whether a process
    holds it now (in use: never evicted nor cleared), the URL; then the total.

    \b
    Example:
      packer cache ls
      packer cache ls --cache-dir /scratch/packer-cache --json
    """
    from packer.core.sizes import format_size
    from packer.remote.cache import ShardCache

    shards = ShardCache(cache_dir)
    entries = shards.entries()
    total = sum(entry.bytes for entry in entries)
    if as_json:
        listed = [asdict(entry) for entry in entries]
        click.echo(json.dumps({"cache_dir": str(shards.dir), "entries": listed, "bytes": total}))
        return
    click.echo(f"{shards.dir}: {len(entries)} objects, {format_size(total)}")
    for entry in entries:
        state = "in use" if entry.in_use else "idle"
        state = f"{'downloading' if entry.in_use else 'stale'} partial" if entry.partial else state
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(entry.used))
        click.echo(f"  {format_size(entry.bytes):>9}  {used}  {state:<16}  {entry.url}")


@cache.command("clear", context_settings=CONTEXT)
@_cache_dir()
@friendly
def clear(cache_dir: Path | None) -> None:
    """Remove every cached object no process holds, and partial downloads of processes that
    died; say which objects were skipped because a process is reading them.

    \b
    Example:
      packer cache clear --cache-dir /scratch/packer-cache
    """
    from packer.core.sizes import format_size
    from packer.remote.cache import ShardCache

    shards = ShardCache(cache_dir)
    removed, skipped = shards.clear()
    freed = sum(entry.bytes for entry in removed)
    click.echo(f"{shards.dir}: removed {len(removed)} objects ({format_size(freed)})")
    if skipped:
        click.echo(f"skipped {len(skipped)} in use (a process is reading them):")
        for entry in skipped:
            click.echo(f"  {format_size(entry.bytes):>9}  {entry.url}")
