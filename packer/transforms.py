"""Public home of packer's transforms: the crops fused with decoding (``RandomResizedCrop``,
``ResizedCenterCrop``, in :mod:`packer.decode.transforms`) that take encoded bytes, and the
batch-level ``Normalize`` / ``RandomHorizontalFlip`` (:mod:`packer.decode.batch`) that finish a
uint8 batch on the device where the model runs."""

from packer.decode.batch import IMAGENET_MEAN, IMAGENET_STD, Normalize, RandomHorizontalFlip
from packer.decode.transforms import (
    TRANSFORM_OUTPUTS,
    RandomResizedCrop,
    ResizedCenterCrop,
    crop_params,
    pick_denom,
)

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "TRANSFORM_OUTPUTS",
    "Normalize",
    "RandomHorizontalFlip",
    "RandomResizedCrop",
    "ResizedCenterCrop",
    "crop_params",
    "pick_denom",
]
