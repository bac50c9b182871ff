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

from packer.core.strings import StringTable
from packer.decode.outputs import decode
from packer.decode.pixels import pixels_output
from packer.errors import InputFileError, PackerError
from packer.read.collate import BytesBatch, empty_bytes
from packer.read.dataset_base import PackedSamples, SampleDataset, Transform
from packer.read.options import ReadOptions, old_name
from packer.read.store import Packed, opened
from packer.source.images import class_dirs, path_keys, scan

__all__ = [
    "BMPDataset",
    "FolderDataset",
    "HDF5Dataset",
    "ImageDataset",
    "LMDBDataset",
    "NPYDataset",
]


class ImageDataset(SampleDataset):
    """Common behaviour of every image dataset: decoding, transforms, whole batches."""

    pixels: tuple[int, ...] | None = (
        None  # records are raw arrays of this shape (packer.decode.pixels)
    )

    def _read(self, i: int) -> bytes:
        return self._read_many([i])[0]

    def _read_many(self, positions: Sequence[int]) -> list[bytes]:
        raise NotImplementedError

    def _finish(self, data: bytes, i: int) -> tuple[Any, Any]:
        try:
            if self.pixels is not None:
                image = pixels_output(data, self.pixels, self.output)
            else:
                image = decode(data, self.output, self.decoder)
        except (OSError, ValueError, SyntaxError) as exc:
            raise InputFileError(f"{self._describe(i)} cannot be decoded: {exc}") from exc
        if self.transform is not None:
            if self.output != "bytes":
                image = self.transform(image)
            else:  # the transform decodes (packer.decode.transforms): its decode errors are the sample's
                try:
                    image = self.transform(image)
                except (OSError, ValueError, SyntaxError) as exc:
                    raise InputFileError(f"{self._describe(i)} cannot be decoded: {exc}") from exc
        return image, self._label(i)

    def _raw(self) -> bool:
        return self.output == "bytes" and self.transform is None and self.target_transform is None

    def _item(self, data: bytes, i: int) -> tuple[Any, Any]:
        return self._or_replacement(
            i, lambda j: self._finish(self._read(j), j), lambda: self._finish(data, i)
        )

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        position = self._position(i)
        return self._item(self._read(position), position)

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[Any, Any]]:
        """A whole batch: read in one pass (one transaction per shard), then decode each."""
        positions = self._positions(indices)
        data = self._read_many(positions)
        if self._raw():
            return list(zip(data, self.targets[positions].tolist()))
        return [self._item(d, i) for d, i in zip(data, positions)]


class PackedDataset(PackedSamples, ImageDataset):
    """A dataset over a packer image output (format given by ``FORMAT``).

    With ``output="bytes"``, ``batch_buffer=True`` (and no transforms) a batch is read straight
    into one buffer (shared memory inside a DataLoader worker) with no ``bytes`` object per
    sample; use it with ``collate_fn=packer.collate_bytes``, which hands the buffer on as
    ``(data, offsets, labels)`` tensors without a copy. (Any other collate would turn it back
    into ``bytes``: a second copy, so it is off by default.) The keyword-only options are the
    read options, :class:`~packer.read.options.ReadOptions`. ``decoder`` picks the JPEG decoder (see
    :class:`~packer.read.dataset_base.SampleDataset`).
    """

    FORMAT = ""

    def __init__(
        self,
        root: str | os.PathLike[str] | Packed,
        transform: Transform = None,
        target_transform: Transform = None,
        output: str = "pil",
        batch_buffer: bool = False,
        on_error: str = "raise",
        decoder: str = "auto",
        *,
        split: str | None = None,
        readahead: bool | None = None,
        max_open_files: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache: bool | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        check_records: bool = False,
    ) -> None:
        options = ReadOptions(
            split,
            readahead,
            max_open_files,
            storage_options,
            cache,
            cache_dir,
            cache_limit,
            check_records,
        )
        packed = opened(root, "image", self.FORMAT or None, options)
        root = packed.given
        options = packed.options
        self.batch_buffer = bool(batch_buffer)
        super().__init__(
            root,
            packed.manifest.classes,
            packed.labels,
            transform,
            target_transform,
            output,
            on_error,
            decoder,
        )
        self._attach(packed)
        self.pixels = packed.manifest.opts.pixels
        self._opened_by(
            PackedDataset,
            dict(
                root=root,
                transform=transform,
                target_transform=target_transform,
                output=output,
                batch_buffer=batch_buffer,
                on_error=on_error,
                decoder=decoder,
                **options.given(),
            ),
        )

    def _read_many(self, positions: Sequence[int]) -> list[bytes]:
        return self.reader.read_many(self.first[np.asarray(positions, dtype=np.int64)])

    def __getitems__(self, indices: Sequence[int]) -> Sequence[tuple[Any, Any]]:
        """A whole batch, read in one pass (one ``getmulti`` per LMDB shard), then decoded; raw
        bytes go straight into one buffer with ``batch_buffer`` (see the class docstring)."""
        positions = self._position_array(indices)
        records = self.first[positions]
        if not (self.batch_buffer and self._raw()):
            stored = self.reader.read_many(records)
            if self._raw():
                return list(zip(stored, self.targets[positions].tolist()))
            return [self._item(d, i) for d, i in zip(stored, positions.tolist())]
        offsets = np.zeros(len(records) + 1, dtype=np.int64)
        np.cumsum(self.reader.lengths(records), out=offsets[1:])
        data = empty_bytes(int(offsets[-1]))
        self.reader.read_into(records, memoryview(data.numpy()), offsets[:-1])  # type: ignore[arg-type]
        return BytesBatch(data, offsets, self.targets[positions])


class LMDBDataset(PackedDataset):
    """Images from a packer ``.lmdb`` output. ``readahead=False`` is a reader option."""

    FORMAT = "lmdb"


class HDF5Dataset(PackedDataset):
    """Images from a packer ``.h5``/``.hdf5`` output."""

    FORMAT = "hdf5"


class NPYDataset(PackedDataset):
    """Images from a packer ``.npy`` output (memory-mapped shards)."""

    FORMAT = "npy"


class BMPDataset(PackedDataset):
    """Decoded images from a packer ``.bmp`` output (no decode cost at read)."""

    FORMAT = "bmp"


class FolderDataset(ImageDataset):
    """A plain ``<class>/<image>`` folder, like torchvision's ``ImageFolder`` without torchvision.

    The baseline packer's benchmarks compare against, and one API for users who read folders.
    It keeps torchvision's hooks: ``is_valid_file(path)`` filters the scanned files; a subclass may
    override :meth:`find_classes` (which class folders, with which indices) and
    :meth:`make_dataset` (the ``(path, class_index)`` samples); ``loader(path)`` replaces
    packer's read and decode (it returns the image the transform receives; ``output`` then
    stays ``"pil"``, and an ``OSError``/``ValueError`` it raises is the sample's
    :class:`~packer.errors.InputFileError`, so ``on_error="skip"`` applies).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        transform: Transform = None,
        target_transform: Transform = None,
        output: str = "pil",
        is_valid_file: Callable[[str], bool] | None = None,
        on_error: str = "raise",
        decoder: str = "auto",
        loader: Callable[[str], Any] | None = None,
    ) -> None:
        if loader is not None and output != "pil":
            raise PackerError(f"output={output!r} does not apply with loader=: it decodes itself")
        classes, class_to_idx = self.find_classes(root)
        samples = self.make_dataset(root, class_to_idx, is_valid_file)
        if not samples:
            raise PackerError(f"no valid image in {str(root)!r}")
        labels = np.array([label for _, label in samples], dtype=np.int64)
        if labels.min() < 0 or labels.max() >= len(classes):
            raise PackerError(
                f"make_dataset gave label {int(labels.max())} for {len(classes)} classes "
                "(find_classes): every label must index the classes"
            )
        super().__init__(
            root, classes, labels, transform, target_transform, output, on_error, decoder
        )
        self.class_to_idx = dict(class_to_idx)
        self.loader = loader
        self.paths = StringTable(path for path, _ in samples)
        self.keys = StringTable(path_keys(root, (path for path, _ in samples)))

    def find_classes(self, directory: str | os.PathLike[str]) -> tuple[list[str], dict[str, int]]:
        """The class names and their indices (torchvision's hook): the sorted class folders."""
        classes = class_dirs(Path(directory))
        return classes, {name: i for i, name in enumerate(classes)}

    def make_dataset(
        self,
        directory: str | os.PathLike[str],
        class_to_idx: dict[str, int],
        is_valid_file: Callable[[str], bool] | None = None,
    ) -> list[tuple[str, int]]:
        """Every ``(path, class_index)`` sample in order (torchvision's hook): the images of the
        class folders ``class_to_idx`` names, walked like ``ImageFolder`` (packer's scan)."""
        result = scan(directory)
        return [
            (s.path, class_to_idx[result.classes[s.label]])
            for s in result.samples
            if result.classes[s.label] in class_to_idx
            and (is_valid_file is None or is_valid_file(s.path))
        ]

    def _describe(self, i: int) -> str:
        return f"sample {i} ({self.paths[i]!r})"

    def _read_many(self, positions: Sequence[int]) -> list[Any]:
        if self.loader is not None:
            return [self.paths[i] for i in positions]  # the loader reads them
        out = []
        for i in positions:
            with open(self.paths[i], "rb") as fh:
                out.append(fh.read())
        return out

    def _finish(self, data: Any, i: int) -> tuple[Any, Any]:
        if self.loader is None:
            return super()._finish(data, i)
        try:
            image = self.loader(data)
        except (OSError, ValueError, SyntaxError) as exc:
            raise InputFileError(f"{self._describe(i)} cannot be loaded: {exc}") from exc
        if self.transform is not None:
            image = self.transform(image)
        return image, self._label(i)


_CLASSES: dict[str, type[PackedDataset]] = {
    cls.FORMAT: cls for cls in (LMDBDataset, HDF5Dataset, NPYDataset, BMPDataset)
}

# The names before one scheme (<FORMAT>Dataset): they still resolve, with a DeprecationWarning.
_OLD_NAMES = {"NpyDataset": NPYDataset}


def __getattr__(name: str) -> Any:
    return old_name(__name__, _OLD_NAMES, name)
