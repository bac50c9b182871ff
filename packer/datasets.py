"""Public home of the image datasets (``packer.datasets.LMDBDataset``, ...); they live in
:mod:`packer.read.datasets`."""

from packer.read.datasets import (
    BMPDataset,
    FolderDataset,
    HDF5Dataset,
    ImageDataset,
    LMDBDataset,
    NPYDataset,
)
from packer.read.open import open_dataset

__all__ = [
    "BMPDataset",
    "FolderDataset",
    "HDF5Dataset",
    "ImageDataset",
    "LMDBDataset",
    "NPYDataset",
    "open_dataset",
]
