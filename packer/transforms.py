"""Public home of the crops fused with decoding (``from packer.transforms import
RandomResizedCrop``); they live in :mod:`packer.decode.transforms`."""

from packer.decode.transforms import (
    TRANSFORM_OUTPUTS,
    RandomResizedCrop,
    ResizedCenterCrop,
    crop_params,
    pick_denom,
)

__all__ = [
    "TRANSFORM_OUTPUTS",
    "RandomResizedCrop",
    "ResizedCenterCrop",
    "crop_params",
    "pick_denom",
]
