"""The exceptions packer raises. Messages say what went wrong, where, and how to fix it."""

from __future__ import annotations

__all__ = [
    "DatasetExistsError",
    "DestinationError",
    "FormatError",
    "InputFileError",
    "PackerError",
    "SourceError",
]


class PackerError(Exception):
    """Base class of every error packer raises on purpose."""


class SourceError(PackerError):
    """The source folder is missing, empty or not laid out as expected."""


class DestinationError(PackerError):
    """The destination cannot be written (exists, unwritable, unknown suffix)."""


class FormatError(PackerError):
    """A packed dataset on disk is incomplete, corrupt or of an unsupported layout version."""


class InputFileError(PackerError):
    """One input file cannot be used (unreadable, not an image, truncated)."""


class DatasetExistsError(DestinationError):
    """The URL already holds a packer dataset that this upload may not replace."""
