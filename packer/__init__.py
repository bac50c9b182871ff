"""packer: pack folders of small images into LMDB, HDF5, NPY or BMP and read them fast in PyTorch."""

from __future__ import annotations

__version__ = "0.1.0"

from packer.collate import collate_bytes, unpack_bytes
from packer.convert import ConvertResult, convert
from packer.datasets import (
    BMPDataset,
    FolderDataset,
    HDF5Dataset,
    LMDBDataset,
    NpyDataset,
    open_dataset,
)
from packer.errors import DestinationError, FormatError, PackerError, SourceError

__all__ = [
    "BMPDataset",
    "ConvertResult",
    "DestinationError",
    "FolderDataset",
    "FormatError",
    "HDF5Dataset",
    "LMDBDataset",
    "NpyDataset",
    "PackerError",
    "SourceError",
    "__version__",
    "collate_bytes",
    "convert",
    "open_dataset",
    "unpack_bytes",
]
