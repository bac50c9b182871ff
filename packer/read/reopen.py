"""What a pickled dataset checks when the process that unpickles it opens its output again
(:class:`packer.read.dataset_base.PackedSamples`): which attributes the caller changed since
the open (:func:`mark`), the folder and ``keys.txt`` it opened still there (:func:`still_there`),
and the message naming what changed (:func:`changed`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from packer.core.contained import open_folder, replaced
from packer.core.manifest import KEYS_NAME

__all__ = ["changed", "mark", "still_there"]


def mark(value: Any) -> tuple[int, str | None]:
    """What tells a value from the one an open made: its ``id``, and a writable array's
    digest (``targets`` can be changed in place)."""
    if isinstance(value, np.ndarray) and value.flags.writeable:
        return id(value), xxhash.xxh3_64_hexdigest(np.ascontiguousarray(value).data)
    return id(value), None


def still_there(identity: dict[str, Any]) -> None:
    """The folder and ``keys.txt`` a dataset opened are still the ones at its path (before it
    is opened again there: a replaced one is named as such).

    Raises:
        FormatError: either was replaced since.
    """
    path, folder, keys = identity["path"], identity["folder"], identity["keys"]
    fd = open_folder(path, folder or None)
    try:
        if keys is not None:
            try:
                st = os.stat(KEYS_NAME, dir_fd=fd, follow_symlinks=False)
            except OSError:
                raise replaced(Path(path) / KEYS_NAME) from None
            if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != keys:
                raise replaced(Path(path) / KEYS_NAME)
    finally:
        os.close(fd)


_WHAT = {
    "manifest": "its packer.json is another (converted or written again, or edited)",
    "folder": "its folder was replaced (--overwrite)",
    "shards": "a shard was replaced",
}


def changed(root: Any, was: dict[str, Any], now: dict[str, Any]) -> str:
    what = "; ".join(_WHAT[k] for k in _WHAT if was.get(k) != now.get(k))
    return (
        f"{str(root)!r} was replaced after the dataset was opened: {what}. This process "
        "(a DataLoader worker, or wherever the dataset was unpickled) opened it again and "
        "refuses to serve other samples than the process that opened it; open the dataset "
        "again (and start a new DataLoader) to read what is there now"
    )
