"""Public home of the image datasets (``packer.datasets.LMDBDataset``, ...) and of
samples with fields (``FieldDataset``); they live in
:mod:`packer.read.datasets`."""

from packer.read.datasets import (
    BMPDataset,
    FolderDataset,
    HDF5Dataset,
    ImageDataset,
    LMDBDataset,
    NPYDataset,
)
from packer.read.fields import FieldDataset, collate_fields
from packer.read.open import open_dataset

__all__ = [
    "BMPDataset",
    "FieldDataset",
    "FolderDataset",
    "HDF5Dataset",
    "ImageDataset",
    "LMDBDataset",
    "NPYDataset",
    "collate_fields",
    "open_dataset",
]
