"""Move batches of encoded images between processes as two tensors instead of many ``bytes``.

With ``num_workers > 0`` the DataLoader pickles each batch through a pipe; a list of Python
``bytes`` is copied and pickled sample by sample. ``collate_bytes`` packs the batch into one
uint8 tensor plus int64 offsets, which travel through shared memory, and ``unpack_bytes`` turns
them back into per-sample buffers in the main process. Use it with ``output="bytes"`` when images
are decoded in the main process or on the GPU (e.g. ``torchvision.io.decode_jpeg(device="cuda")``).

Example::

    ds = packer.LMDBDataset("train.lmdb", output="bytes")
    loader = DataLoader(ds, batch_size=256, num_workers=8, collate_fn=packer.collate_bytes)
    for data, offsets, labels in loader:
        images = [decode(buf) for buf in packer.unpack_bytes(data, offsets)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

__all__ = ["collate_bytes", "unpack_bytes"]


def _empty_bytes(size: int) -> torch.Tensor:
    """A uint8 tensor; inside a DataLoader worker, allocated in shared memory right away, so
    sending it to the main process moves a file descriptor instead of copying the batch again."""
    if get_worker_info() is None:
        return torch.empty(size, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(size)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def collate_bytes(
    batch: Sequence[tuple[bytes, Any]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack ``[(bytes, label), ...]`` into ``(data uint8[N], offsets int64[B+1], labels int64[B])``."""
    blobs = [item[0] for item in batch]
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    data = _empty_bytes(int(offsets[-1]))
    view = data.numpy()
    for blob, start, stop in zip(blobs, offsets[:-1], offsets[1:]):
        view[start:stop] = np.frombuffer(blob, dtype=np.uint8)
    labels = torch.as_tensor([int(item[1]) for item in batch], dtype=torch.int64)
    return data, torch.from_numpy(offsets), labels


def unpack_bytes(data: torch.Tensor, offsets: torch.Tensor) -> list[memoryview]:
    """Split a packed batch back into one read-only buffer per sample (no copy)."""
    flat = memoryview(data.numpy().data).cast("B")
    bounds = offsets.tolist()
    return [flat[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]
