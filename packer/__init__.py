"""packer: pack folders of small images into LMDB, HDF5, NPY or BMP and read them fast in PyTorch.

Public names load on first use (PEP 562), so ``packer convert`` starts without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from packer._version import __version__

# Eager (and torch-free): these functions share their module's name, so they must be bound here.
from packer.convert import ConvertResult, convert  # noqa: E402
from packer.errors import (  # noqa: E402
    DatasetExistsError,
    DestinationError,
    FormatError,
    InputFileError,
    PackerError,
    SourceError,
)
from packer.merge import merge  # noqa: E402
from packer.verify import Problem, VerifyReport, verify  # noqa: E402

_EXPORTS = {
    "BMPDataset": "packer.datasets",
    "FolderDataset": "packer.datasets",
    "HDF5Dataset": "packer.datasets",
    "LMDBDataset": "packer.datasets",
    "NPYDataset": "packer.datasets",
    "NpyDataset": "packer.datasets",
    "open_dataset": "packer.datasets",
    "collate_bytes": "packer.collate",
    "unpack_bytes": "packer.collate",
    "ShardedSampler": "packer.sampler",
    "Mixture": "packer.mixture",
    "LoaderReport": "packer.tools.diagnose",
    "diagnose": "packer.tools.diagnose",
    "worker_init_fn": "packer.tools.worker_threads",
    "BMPVideoDataset": "packer.video.datasets",
    "HDF5VideoDataset": "packer.video.datasets",
    "LMDBVideoDataset": "packer.video.datasets",
    "NPYVideoDataset": "packer.video.datasets",
    "NpyVideoDataset": "packer.video.datasets",
    "FolderVideoDataset": "packer.video.datasets",
    "VideoFolderDataset": "packer.video.datasets",
    "open_video_dataset": "packer.video.datasets",
    "convert_to_url": "packer.staging",
}

__all__ = [
    "BMPDataset",
    "BMPVideoDataset",
    "ConvertResult",
    "DatasetExistsError",
    "DestinationError",
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
    "NpyDataset",
    "NpyVideoDataset",
    "PackerError",
    "Problem",
    "ShardedSampler",
    "SourceError",
    "VerifyReport",
    "VideoFolderDataset",
    "__version__",
    "collate_bytes",
    "convert",
    "convert_to_url",
    "diagnose",
    "merge",
    "open_dataset",
    "open_video_dataset",
    "unpack_bytes",
    "verify",
    "worker_init_fn",
]

if TYPE_CHECKING:
    from packer.collate import collate_bytes, unpack_bytes
    from packer.datasets import (
        BMPDataset,
        FolderDataset,
        HDF5Dataset,
        LMDBDataset,
        NPYDataset,
        NpyDataset,
        open_dataset,
    )
    from packer.mixture import Mixture
    from packer.sampler import ShardedSampler
    from packer.staging import convert_to_url
    from packer.tools.diagnose import LoaderReport, diagnose
    from packer.tools.worker_threads import worker_init_fn
    from packer.video.datasets import (
        BMPVideoDataset,
        FolderVideoDataset,
        HDF5VideoDataset,
        LMDBVideoDataset,
        NPYVideoDataset,
        NpyVideoDataset,
        VideoFolderDataset,
        open_video_dataset,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
