"""``packer.merge``: the parts of a local dataset or of a dataset at a URL joined by one call."""

from __future__ import annotations

import os
from typing import Any

from packer.remote.storage import is_url
from packer.upload.staging import merge_to_url
from packer.write.merge import merge as merge_local
from packer.write.result import ConvertResult

__all__ = ["merge"]


def merge(
    dst: str | os.PathLike[str],
    *,
    overwrite: bool = False,
    progress: bool = True,
    storage_options: dict[str, Any] | None = None,
    staging: str | os.PathLike[str] | None = None,
    keep_staging: bool = False,
) -> ConvertResult:
    """Join the complete parts of ``dst`` into one dataset, the same bytes as one conversion.

    A local ``dst`` joins ``DST.part-0 ... DST.part-{N-1}`` (``packer convert --part I/N``); a
    URL joins the parts staged by ``convert_to_url(..., part=(i, n))`` and uploads the result
    (:func:`packer.merge_to_url`; ``storage_options``, ``staging`` and ``keep_staging`` are
    its own and apply to a URL only).

    Raises:
        PackerError: a part missing, incomplete or of another conversion; ``dst`` exists
            (without ``overwrite``); a URL option given for a local ``dst``.
    """
    if is_url(dst):
        return merge_to_url(
            os.fspath(dst),
            storage_options=storage_options,
            staging=staging,
            keep_staging=keep_staging,
            overwrite=overwrite,
            progress=progress,
        )
    if storage_options is not None or staging is not None or keep_staging:
        from packer.errors import PackerError

        raise PackerError(
            f"storage_options, staging and keep_staging are for a URL; {os.fspath(dst)!r} is a "
            "local path"
        )
    return merge_local(dst, overwrite=overwrite, progress=progress)
