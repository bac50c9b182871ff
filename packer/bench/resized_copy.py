"""``packer bench --short-side N``: a copy of a dataset's benched samples stored at N px.

The samples are read as stored (encoded bytes), written to a temporary class tree and converted
with :func:`packer.convert` ``short_side=N`` (the write-time resize a user would run), so the bench
times exactly what ``packer convert SRC DST --short-side N`` would give on this data, side by side
with the original, in the same run.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from packer.diagnosis.targets import close_dataset, open_for_mode, subset_indices
from packer.errors import PackerError

__all__ = ["resized_copy"]


def resized_copy(
    path: str | os.PathLike[str], short_side: int, limit: int | None, workdir: Path
) -> Path:
    """Write the first ``limit`` samples of ``path`` (all if None) as ``workdir/<name>@<N>.lmdb``
    with their shorter side shrunk to ``short_side``; return that path.

    Raises:
        PackerError: ``path`` holds videos (resize their frames at conversion instead).
    """
    dataset = open_for_mode(path, "bytes")
    name = Path(path).name.split(".")[0] or "data"
    tree = workdir / f"{name}-source"
    try:
        for i in subset_indices(dataset, limit):
            data, label = dataset[i]
            if isinstance(data, list):
                raise PackerError(
                    f"{str(path)!r} holds videos: --short-side benches images; convert the "
                    "videos with --short-side instead"
                )
            folder = tree / f"class_{int(label):05d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{i:09d}.jpg").write_bytes(bytes(data))
    finally:
        close_dataset(dataset)
    dst = workdir / f"{name}@{short_side}.lmdb"
    from packer.write.convert import convert

    convert(tree, dst, short_side=short_side, check="fast", progress=False, overwrite=True)
    shutil.rmtree(tree)
    return dst
