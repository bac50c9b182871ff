"""The error for a full disk, with an estimate of how much more the conversion needs.

The remaining need is not the source's size minus what was written: a format that transcodes
(BMP stores pixels, ~10× its JPEG inputs) writes more than it reads, and the tables and manifest
come last. So the data still to write is estimated at the ratio of bytes written per input
byte in the finished shards, plus the tables not yet written; the message says it is an estimate
and how it was made.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from packer.core.manifest import INDEX_NAME, KEYS_NAME, MANIFEST_NAME, RECORDS_NAME
from packer.core.sizes import format_size
from packer.core.tablefile import temp_name
from packer.errors import DestinationError
from packer.write.resume import Progress

__all__ = ["disk_full_error", "estimate_need"]

_TABLES = frozenset(  # every name a table or the manifest has, finished or being written
    n for t in (INDEX_NAME, RECORDS_NAME, KEYS_NAME, MANIFEST_NAME) for n in (t, temp_name(t))
)


def _written(partial: Path) -> tuple[int, int]:
    """Bytes on disk in ``partial``: (data files, tables and manifest); progress not counted."""
    data = tables = 0
    for root, dirs, files in os.walk(partial):
        if Path(root) == partial:
            dirs[:] = [d for d in dirs if d != "_progress"]
        for name in files:
            try:
                size = os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            if Path(root) == partial and name in _TABLES:
                tables += size
            else:
                data += size
    return data, tables


def estimate_need(partial: Path, source: Any) -> tuple[int, str]:
    """How many more bytes ``partial`` needs to be complete, and how that was estimated: the
    data still to write at the ratio of bytes written per input byte in the finished shards
    (BMP writes pixels: ~10× its JPEG inputs), plus the tables (16 bytes a sample, 24 a
    record, the keys, ~4 kB of manifest) not yet written. Without a finished shard, the source's
    size stands for the data (said so: a transcoding format needs more)."""
    done = Progress(partial).finished()
    keys = {k for c in done for k in c.keys}
    dropped = {s["path"] for c in done for s in c.skipped}
    inputs_done = sum(s.size for s in source.samples if s.key in keys or s.path in dropped)
    records = sum(len(c.records) for c in done)
    per_sample = records / len(keys) if keys else 1.0
    n = len(source.samples)
    key_bytes = sum(len(os.fsencode(s.key)) + 1 for s in source.samples)
    data, tables_written = _written(partial)
    manifest = 4096 + sum(len(c) + 8 for c in source.classes) + 256 * len(source.skipped)
    tables = 16 * n + int(24 * per_sample * n) + key_bytes + manifest
    tables_left = max(tables - tables_written, 0)
    if inputs_done == 0:
        need = max(source.total_bytes - data, 0) + tables_left
        return need, (
            "an estimate from the inputs' size: no shard is finished yet, and a format that "
            "transcodes (bmp, npy with --size) writes more than it reads"
        )
    ratio = data / inputs_done
    need = max(int(ratio * source.total_bytes) - data, 0) + tables_left
    return need, (
        f"an estimate: {ratio:.2f} bytes written per input byte so far, plus "
        f"{format_size(tables_left)} of tables"
    )


def disk_full_error(partial: Path, source: Any) -> DestinationError:
    """The error for a full disk: how much more is needed (an estimate, said so), what is free,
    how to go on."""
    free = shutil.disk_usage(partial.parent).free
    need, how = estimate_need(partial, source)
    return DestinationError(
        f"disk full while writing {str(partial)!r}: about {format_size(need)} more is needed "
        f"({how}) and {format_size(free)} is free. The finished shards are kept: free space, "
        "then run the same command with --resume"
    )
