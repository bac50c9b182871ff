"""packer: pack folders of small images into LMDB, HDF5, NPY or BMP and read them fast in PyTorch.

Public names load on first use (PEP 562), so ``packer convert`` starts without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from packer._version import __version__
from packer.errors import (  # noqa: E402
    DatasetExistsError,
    DestinationError,
    FormatError,
    InputFileError,
    PackerError,
    SourceError,
)
from packer.read.verify import Problem, VerifyReport, verify  # noqa: E402
from packer.upload.merging import merge  # noqa: E402  (a local dataset's parts, or a URL's)

# Eager and torch-free: a conversion starts without importing torch.
from packer.write.convert import ConvertOptions, ConvertResult, convert  # noqa: E402

_EXPORTS = {
    "BMPDataset": "packer.read.datasets",
    "FolderDataset": "packer.read.datasets",
    "HDF5Dataset": "packer.read.datasets",
    "LMDBDataset": "packer.read.datasets",
    "NPYDataset": "packer.read.datasets",
    "open_dataset": "packer.read.open",
    "FieldDataset": "packer.read.fields",
    "collate_fields": "packer.read.fields",
    "collate_bytes": "packer.read.collate",
    "unpack_bytes": "packer.read.collate",
    "ShardedSampler": "packer.read.sampler",
    "Mixture": "packer.read.mixture",
    "LoaderReport": "packer.diagnosis.diagnose",
    "diagnose": "packer.diagnosis.diagnose",
    "worker_init_fn": "packer.diagnosis.worker_threads",
    "BMPVideoDataset": "packer.read.video_datasets",
    "HDF5VideoDataset": "packer.read.video_datasets",
    "LMDBVideoDataset": "packer.read.video_datasets",
    "NPYVideoDataset": "packer.read.video_datasets",
    "FolderVideoDataset": "packer.read.video_datasets",
    "open_video_dataset": "packer.read.open",
    "convert_to_url": "packer.upload.staging",
    "merge_to_url": "packer.upload.staging",
    "Writer": "packer.upload.url_writer",
    "pack": "packer.write.pack",
    # old names: they resolve with a DeprecationWarning (and are not in __all__)
    "NpyDataset": "packer.read.datasets",
    "NpyVideoDataset": "packer.read.video_datasets",
    "VideoFolderDataset": "packer.read.video_datasets",
}

__all__ = [
    "BMPDataset",
    "BMPVideoDataset",
    "ConvertOptions",
    "ConvertResult",
    "DatasetExistsError",
    "DestinationError",
    "FieldDataset",
    "FolderDataset",
    "FolderVideoDataset",
    "FormatError",
    "HDF5Dataset",
    "HDF5VideoDataset",
    "InputFileError",
    "LMDBDataset",
    "LMDBVideoDataset",
    "LoaderReport",
    "Mixture",
    "NPYDataset",
    "NPYVideoDataset",
    "PackerError",
    "Problem",
    "ShardedSampler",
    "SourceError",
    "VerifyReport",
    "Writer",
    "__version__",
    "collate_bytes",
    "collate_fields",
    "convert",
    "convert_to_url",
    "diagnose",
    "merge",
    "merge_to_url",
    "open_dataset",
    "open_video_dataset",
    "pack",
    "unpack_bytes",
    "verify",
    "worker_init_fn",
]

if TYPE_CHECKING:
    from packer.diagnosis.diagnose import LoaderReport, diagnose
    from packer.diagnosis.worker_threads import worker_init_fn
    from packer.read.collate import collate_bytes, unpack_bytes
    from packer.read.datasets import (
        BMPDataset,
        FolderDataset,
        HDF5Dataset,
        LMDBDataset,
        NPYDataset,
    )
    from packer.read.fields import FieldDataset, collate_fields
    from packer.read.mixture import Mixture
    from packer.read.open import open_dataset, open_video_dataset
    from packer.read.sampler import ShardedSampler
    from packer.read.video_datasets import (
        BMPVideoDataset,
        FolderVideoDataset,
        HDF5VideoDataset,
        LMDBVideoDataset,
        NPYVideoDataset,
    )
    from packer.upload.staging import convert_to_url, merge_to_url
    from packer.upload.url_writer import Writer
    from packer.write.pack import pack


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
