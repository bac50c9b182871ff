"""Which datasets a measurement opens, which files hold them, and how their bytes are counted.

Shared by :mod:`packer.bench.bench`, :mod:`packer.bench.storage_cost` and :mod:`packer.diagnosis.doctor`; plain functions,
no printing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset, default_collate

from packer.core.manifest import MANIFEST_NAME, Manifest, load_manifest
from packer.errors import PackerError
from packer.read.collate import collate_bytes
from packer.remote.storage import is_url
from packer.source.images import scan

__all__ = [
    "CACHES",
    "MODES",
    "bench_collate",
    "close_dataset",
    "cold_supported",
    "data_files",
    "disk_bytes",
    "evict_page_cache",
    "files_for",
    "open_for_mode",
    "path_labels",
    "payload_bytes",
    "stored_bytes",
    "subset_indices",
]


def data_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files holding a dataset's data: a packer output's shards/files, or a folder's images
    (or, for a ``<class>/<video>/<frame>`` tree, its frames and video files)."""
    if is_url(path):
        return []  # objects in a store: no local file, no page cache to evict or count
    root = Path(path)
    if (root / MANIFEST_NAME).is_file():
        manifest = load_manifest(root)
        if manifest.shards:
            return [root / s.name for s in manifest.shards]
        return sorted(p for p in root.rglob("*") if p.is_file())
    from packer.source.detect import detect_kind
    from packer.source.videos import scan_videos

    if root.is_dir() and detect_kind(root) == "video":
        videos = scan_videos(root).videos
        return [Path(f) for v in videos for f in (v.frames if v.frames is not None else (v.path,))]
    return [Path(s.path) for s in scan(root).samples]


def disk_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes on disk of a file, or of all the files under a folder."""
    root = Path(path)
    if root.is_file():
        return root.stat().st_size
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def evict_page_cache(paths: Iterable[str | os.PathLike[str]]) -> int:
    """Drop the files' pages from the page cache (``POSIX_FADV_DONTNEED`` after ``sync``).

    Returns the number of files evicted; 0 where ``posix_fadvise`` does not exist.
    """
    if not hasattr(os, "posix_fadvise"):
        return 0
    os.sync()
    count = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            count += 1
        finally:
            os.close(fd)
    return count


MODES = ("bytes", "decode", "transform")
CACHES = ("warm", "cold")


def open_for_mode(
    path: str | os.PathLike[str],
    mode: str,
    decoder: str = "auto",
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Open a packer output or image folder for a bench mode.

    ``bytes``: stored bytes, no decode (IO + format cost); ``decode``: decoded H×W×3 arrays;
    ``transform``: decoded then :func:`packer.diagnosis.train_transform.train_transform` (224×224 crops).
    ``decoder`` names the decoder of the decoding modes (see :mod:`packer.decode.registry`).
    A URL (``s3://...``) is opened through ``storage_options``.

    Raises:
        PackerError: unknown mode, or the path is neither a packer output nor an image folder.
    """
    from packer.diagnosis.train_transform import train_transform
    from packer.read.open import open_dataset

    if mode not in MODES:
        raise PackerError(f"unknown bench mode {mode!r}; expected one of {', '.join(MODES)}")
    remote: dict[str, Any] = {}
    if is_url(path):
        remote["storage_options"] = dict(storage_options or {})
    elif not Path(path).exists():
        raise PackerError(f"{str(path)!r} does not exist")
    with _manifest(path, remote) as manifest:  # a URL's manifest: fetched once, for the open too
        image = _image_field(manifest, path)
        if image is not None:  # samples with fields: their image field alone, as a 1-tuple
            remote["fields"] = (image,)
        if mode == "bytes":  # batches go to collate_bytes: packed images read straight into one
            dataset = open_dataset(path, output="bytes", **remote)
            if image is None and hasattr(dataset, "batch_buffer"):
                dataset.batch_buffer = True
            return dataset
        if mode == "decode":
            return open_dataset(path, output="numpy", decoder=decoder, **remote)
        crop = train_transform() if image is None else {image: train_transform()}
        return open_dataset(path, output="pil", transform=crop, decoder=decoder, **remote)


@contextmanager
def _manifest(path: str | os.PathLike[str], remote: dict[str, Any]) -> Iterator[Manifest | None]:
    """The manifest of the packer output at ``path`` (None for an image folder); for a URL,
    handed to an open of the same URL inside the block instead of being fetched again."""
    if is_url(path):
        from packer.remote.opener import fetched_manifest

        with fetched_manifest(str(path), None, remote.get("storage_options")) as (_, manifest):
            yield manifest
    elif (Path(path) / MANIFEST_NAME).is_file():
        yield load_manifest(path)
    else:
        yield None


def _image_field(manifest: Manifest | None, path: str | os.PathLike[str]) -> str | None:
    """The image field a dataset with fields is measured by (its first), None for any other.

    Raises:
        PackerError: a dataset with fields but no image field.
    """
    if manifest is None or manifest.kind != "fields":
        return None
    specs = manifest.opts.fields
    images = [s.name for s in specs if s.kind == "image"]
    if not images:
        fields = ", ".join(s.name for s in specs)
        raise PackerError(f"{str(path)!r} has no image field to measure (fields: {fields})")
    return images[0]


def bench_collate(batch: Sequence[Any]) -> Any:
    """Collate as a training loop would: encoded bytes → :func:`packer.collate_bytes`; equal-shape
    arrays (transform mode) → stacked tensors; anything else (decoded images of varied sizes,
    clips) → the list as is."""
    first: Any = batch[0][0] if batch and isinstance(batch[0], (tuple, list)) else None
    if isinstance(first, (bytes, bytearray, memoryview)):
        return collate_bytes(batch) if len(batch[0]) > 1 else [b[0] for b in batch]
    shape = getattr(first, "shape", None)
    if shape is not None and all(getattr(b[0], "shape", None) == shape for b in batch):
        return default_collate(list(batch))
    return list(batch)


def subset_indices(dataset: Dataset, limit: int | None) -> list[int]:
    """The first ``limit`` samples of the dataset (all of them when ``limit`` is None)."""
    n = len(dataset)  # type: ignore[arg-type]
    return list(range(n if limit is None else min(limit, n)))


def stored_bytes(dataset: Dataset, path: str | os.PathLike[str], indices: Sequence[int]) -> int:
    """Bytes the samples occupy on storage (the index's lengths, or the files' sizes)."""
    stored = getattr(dataset, "stored_bytes", None)
    if stored is not None:
        return int(stored(indices))
    paths = getattr(dataset, "paths", None)
    if paths is not None:
        return sum(os.path.getsize(paths[i]) for i in indices)
    total = sum(f.stat().st_size for f in data_files(path))
    return int(total * len(indices) / max(1, len(dataset)))  # type: ignore[arg-type]


def _frame_bytes(dataset: Any, i: int, frames: np.ndarray) -> int:
    """Stored bytes of frames ``frames`` of video ``i`` (a packer output or a frame folder)."""
    reader, first = getattr(dataset, "reader", None), getattr(dataset, "first", None)
    if reader is not None and first is not None:
        return int(reader.lengths(int(first[i]) + frames).sum())
    paths, starts = getattr(dataset, "_paths", None), getattr(dataset, "_first", None)
    if paths is not None and starts is not None:  # VideoFolderDataset: one file per frame
        return sum(os.path.getsize(paths[int(starts[i] + j)]) for j in frames.tolist())
    raise PackerError(f"cannot tell the frame sizes of {type(dataset).__name__}")


def payload_bytes(dataset: Dataset, path: str | os.PathLike[str], indices: Sequence[int]) -> int:
    """Bytes the samples hand back: for a clip dataset, the stored bytes of each clip's distinct
    sampled frames (its current epoch and seed; a frame repeated to pad a short video counts
    once, as it is read once); for an image dataset, the images' stored bytes."""
    clip_indices = getattr(dataset, "clip_indices", None)
    if clip_indices is None:
        return stored_bytes(dataset, path, indices)
    return sum(_frame_bytes(dataset, i, np.unique(clip_indices(i))) for i in indices)


def files_for(dataset: Dataset, path: str | os.PathLike[str], indices: Sequence[int]) -> list[Path]:
    """The files holding these samples: a folder's image files, else the dataset's data files."""
    paths = getattr(dataset, "paths", None)
    if paths is not None:
        return [Path(paths[i]) for i in indices]
    return data_files(path)


def close_dataset(dataset: Dataset) -> None:
    """Close a dataset's handles in this process, so no mapping pins pages in the cache."""
    target = getattr(dataset, "dataset", dataset)  # a Subset or wrapper
    for obj in (getattr(target, "reader", None), target):
        close = getattr(obj, "close", None)
        if callable(close):
            close()
            return


def cold_supported() -> bool:
    """Whether page-cache eviction (``posix_fadvise``) exists on this platform."""
    return hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")


def path_labels(paths: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Short unique labels: the paths' names, or the paths themselves when names repeat."""
    names = [Path(p).name or str(p) for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]
