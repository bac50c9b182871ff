"""PyTorch datasets over packed formats and plain image folders.

Every dataset returns ``(image, label)`` like torchvision's ``ImageFolder``, exposes ``classes``,
``class_to_idx``, ``targets`` (a numpy array) and ``__len__``, and serves a whole batch at once
through ``__getitems__`` (the DataLoader calls it when present). It holds only picklable state:
paths, numpy index arrays and options. File handles open lazily in each process that reads, so a
dataset built in the parent works in DataLoader workers under fork, forkserver and spawn.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from packer.decode import check_output, decode
from packer.errors import FormatError, InputFileError, PackerError
from packer.formats import by_name
from packer.formats.common import check_shard_files
from packer.manifest import MANIFEST_NAME, load_index, load_keys, load_manifest
from packer.sources import scan
from packer.strings import StringTable

__all__ = [
    "BMPDataset",
    "FolderDataset",
    "HDF5Dataset",
    "ImageDataset",
    "LMDBDataset",
    "NpyDataset",
    "open_dataset",
]

Transform = Callable[[Any], Any] | None


class ImageDataset(Dataset):
    """Common behaviour of every image dataset: indexing, decoding, transforms, batches."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        classes: list[str],
        labels: np.ndarray,
        transform: Transform = None,
        target_transform: Transform = None,
        output: str = "pil",
    ) -> None:
        self.root = Path(root)
        self.classes = list(classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.targets = np.ascontiguousarray(labels, dtype=np.int64)
        self.transform = transform
        self.target_transform = target_transform
        self.output = check_output(output)

    def __len__(self) -> int:
        return len(self.targets)

    def _position(self, i: int) -> int:
        n = len(self.targets)
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"dataset indices must be integers, not {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} samples")
        return int(i) % n

    def _read(self, i: int) -> bytes:
        raise NotImplementedError

    def _read_many(self, positions: Sequence[int]) -> list[bytes]:
        return [self._read(i) for i in positions]

    def _describe(self, i: int) -> str:
        return f"sample {i}"

    def _finish(self, data: bytes, i: int) -> tuple[Any, Any]:
        try:
            image = decode(data, self.output)
        except (OSError, ValueError, SyntaxError) as exc:
            raise InputFileError(f"{self._describe(i)} cannot be decoded: {exc}") from exc
        if self.transform is not None:
            image = self.transform(image)
        label: Any = int(self.targets[i])
        if self.target_transform is not None:
            label = self.target_transform(label)
        return image, label

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        position = self._position(i)
        return self._finish(self._read(position), position)

    def _positions(self, indices: Sequence[int]) -> list[int]:
        n = len(self.targets)
        try:
            idx = np.asarray(indices, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            return [self._position(i) for i in indices]  # raises the precise error
        if idx.ndim != 1:
            raise TypeError("a batch of indices must be a flat sequence of integers")
        if len(idx) and (idx.min() < -n or idx.max() >= n):
            bad = next(int(i) for i in idx if not -n <= i < n)
            raise IndexError(f"index {bad} out of range for a dataset of {n} samples")
        return (idx % n).tolist() if n else []

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        """A whole batch: read in one pass (one transaction per shard), then decode each."""
        positions = self._positions(indices)
        data = self._read_many(positions)
        if self.output == "bytes" and self.transform is None and self.target_transform is None:
            return list(zip(data, self.targets[positions].tolist()))
        return [self._finish(d, i) for d, i in zip(data, positions)]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.root)!r}, samples={len(self)}, "
            f"classes={len(self.classes)}, output={self.output!r})"
        )


class PackedDataset(ImageDataset):
    """A dataset over a packer output directory (format given by ``FORMAT``)."""

    FORMAT = ""

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Transform = None,
        target_transform: Transform = None,
        output: str = "pil",
        **reader_options: Any,
    ) -> None:
        manifest = load_manifest(root)
        if self.FORMAT and manifest.format != self.FORMAT:
            raise FormatError(
                f"{str(root)!r} holds format {manifest.format!r}, not {self.FORMAT!r}; "
                "use packer.open_dataset() to pick the right class"
            )
        if manifest.kind != "image":
            raise FormatError(f"{str(root)!r} holds {manifest.kind!r} samples, not images")
        index = load_index(root, manifest)
        check_shard_files(Path(root), manifest)
        super().__init__(
            root, manifest.classes, index["label"], transform, target_transform, output
        )
        self.manifest = manifest
        self.reader = by_name(manifest.format).Reader(root, manifest, index, **reader_options)
        self._keys: StringTable | None = None

    @property
    def keys(self) -> StringTable:
        """Each sample's key (its source path relative to the root, without suffix)."""
        if self._keys is None:
            self._keys = StringTable(load_keys(self.root))
        return self._keys

    def _describe(self, i: int) -> str:
        return f"sample {i} ({self.keys[i]!r} in {str(self.root)!r})"

    def _read(self, i: int) -> bytes:
        return self.reader.read(i)

    def _read_many(self, positions: Sequence[int]) -> list[bytes]:
        return self.reader.read_many(positions)


class LMDBDataset(PackedDataset):
    """Images from a packer ``.lmdb`` output. ``readahead=False`` is a reader option."""

    FORMAT = "lmdb"


class HDF5Dataset(PackedDataset):
    """Images from a packer ``.h5``/``.hdf5`` output."""

    FORMAT = "hdf5"


class NpyDataset(PackedDataset):
    """Images from a packer ``.npy`` output (memory-mapped shards)."""

    FORMAT = "npy"


class BMPDataset(PackedDataset):
    """Decoded images from a packer ``.bmp`` output (no decode cost at read)."""

    FORMAT = "bmp"


class FolderDataset(ImageDataset):
    """A plain ``<class>/<image>`` folder, like torchvision's ``ImageFolder`` without torchvision.

    The baseline packer's benchmarks compare against, and one API for users who read folders.
    ``is_valid_file(path)`` filters the scanned files, as in torchvision.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Transform = None,
        target_transform: Transform = None,
        output: str = "pil",
        is_valid_file: Callable[[str], bool] | None = None,
    ) -> None:
        result = scan(root)
        samples = [s for s in result.samples if is_valid_file is None or is_valid_file(s.path)]
        if not samples:
            raise PackerError(f"no valid image in {str(root)!r}")
        labels = np.array([s.label for s in samples], dtype=np.int64)
        super().__init__(root, result.classes, labels, transform, target_transform, output)
        self.paths = StringTable(s.path for s in samples)
        self.keys = StringTable(s.key for s in samples)

    def _describe(self, i: int) -> str:
        return f"sample {i} ({self.paths[i]!r})"

    def _read(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as fh:
            return fh.read()


_CLASSES: dict[str, type[PackedDataset]] = {
    cls.FORMAT: cls for cls in (LMDBDataset, HDF5Dataset, NpyDataset, BMPDataset)
}


def open_dataset(path: str | os.PathLike[str], **kwargs: Any) -> ImageDataset:
    """Open a packer output (any format and kind, read from its manifest) or a plain folder
    (``<class>/<image>`` or ``<class>/<video>/<frame>``).

    Keyword arguments go to the dataset class (``transform``, ``output``, reader options; for
    video ``num_frames``, ``sampling``, ``stride``, ``seed``).

    Raises:
        PackerError: the path is neither a packer output nor an image folder.
    """
    root = Path(path)
    if not root.exists():
        raise PackerError(f"{str(root)!r} does not exist")
    if (root / MANIFEST_NAME).is_file():
        manifest = load_manifest(root)
        if manifest.kind == "video":
            from packer.video.datasets import open_video_dataset

            return open_video_dataset(root, **kwargs)  # type: ignore[return-value]
        return _CLASSES[manifest.format](root, **kwargs)
    if root.suffix.lower() in {".lmdb", ".h5", ".hdf5", ".npy", ".bmp"} and root.is_dir():
        raise FormatError(
            f"{str(root)!r} has no {MANIFEST_NAME}: it is not a complete packer output"
        )
    if root.is_dir():
        from packer.video.sources import detect_kind

        if detect_kind(root) == "video":
            from packer.video.datasets import open_video_dataset

            return open_video_dataset(root, **kwargs)  # type: ignore[return-value]
        return FolderDataset(root, **kwargs)
    raise PackerError(f"{str(root)!r} is neither a packer output nor an image folder")
