"""Move batches of encoded images between processes as two tensors instead of many ``bytes``.

With ``num_workers > 0`` the DataLoader pickles each batch through a pipe; a list of Python
``bytes`` is copied and pickled sample by sample. ``collate_bytes`` packs the batch into one
uint8 tensor plus int64 offsets, which travel through shared memory, and ``unpack_bytes`` turns
them back into per-sample buffers in the main process. Use it with ``output="bytes"`` when images
are decoded in the main process or on the GPU (e.g. ``torchvision.io.decode_jpeg(device="cuda")``).

Packed datasets go one step further: with ``output="bytes"`` their ``__getitems__`` reads the
batch straight into that one buffer (``Reader.read_into``) and returns a :class:`BytesBatch`,
which ``collate_bytes`` hands on without copying (any other collate sees ``(bytes, label)`` pairs).

Example::

    ds = packer.LMDBDataset("train.lmdb", output="bytes")
    loader = DataLoader(ds, batch_size=256, num_workers=8, collate_fn=packer.collate_bytes)
    for data, offsets, labels in loader:
        images = [decode(buf) for buf in packer.unpack_bytes(data, offsets)]
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from packer.read.transport import SharedBatch, shared_bytes

__all__ = ["BytesBatch", "collate_bytes", "empty_bytes", "unpack_bytes"]


def empty_bytes(size: int) -> torch.Tensor:
    """A uint8 tensor; inside a DataLoader worker, allocated in shared memory right away, so
    sending it to the main process moves a file descriptor instead of copying the batch again:
    one of the worker's reused slots when one is free (:mod:`packer.read.transport`)."""
    if get_worker_info() is None:
        return torch.empty(size, dtype=torch.uint8)
    reused = shared_bytes(size)
    if reused is not None:
        return reused
    storage = torch.UntypedStorage._new_shared(size)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


class BytesBatch(Sequence[tuple[bytes, int]]):
    """A batch of ``(encoded bytes, label)`` pairs held as one uint8 buffer plus offsets.

    Indexing makes the ``bytes`` of one sample on demand, so the default collate still works;
    :func:`collate_bytes` takes the buffer as it is.
    """

    def __init__(self, data: torch.Tensor, offsets: np.ndarray, labels: np.ndarray) -> None:
        self.data = data
        self.offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.labels = np.ascontiguousarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[j] for j in range(*k.indices(len(self)))]
        k = int(k) + len(self) if k < 0 else int(k)
        if not 0 <= k < len(self):
            raise IndexError(f"index out of range for a batch of {len(self)}")
        start, stop = int(self.offsets[k]), int(self.offsets[k + 1])
        return self.data.numpy()[start:stop].tobytes(), int(self.labels[k])

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        return (self[k] for k in range(len(self)))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def collate_bytes(
    batch: Sequence[tuple[bytes, Any]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Pack ``[(bytes, label), ...]`` into ``(data uint8[N], offsets int64[B+1], labels int64[B])``."""
    if isinstance(batch, BytesBatch):
        return _batch(batch.data, torch.from_numpy(batch.offsets), torch.from_numpy(batch.labels))
    blobs = [item[0] for item in batch]
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    data = empty_bytes(int(offsets[-1]))
    view = data.numpy()
    for blob, start, stop in zip(blobs, offsets[:-1], offsets[1:]):
        view[start:stop] = np.frombuffer(blob, dtype=np.uint8)
    labels = torch.as_tensor([int(item[1]) for item in batch], dtype=torch.int64)
    return _batch(data, torch.from_numpy(offsets), labels)


def _batch(
    data: torch.Tensor, offsets: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The three tensors; in a worker as a SharedBatch (a tuple), so that data in a reused slot
    reaches the receiver without a copy."""
    if get_worker_info() is None:
        return data, offsets, labels
    return SharedBatch((data, offsets, labels))


def unpack_bytes(data: torch.Tensor, offsets: torch.Tensor) -> list[memoryview]:
    """Split a packed batch back into one read-only buffer per sample (no copy)."""
    flat = memoryview(data.numpy().data).cast("B")
    bounds = offsets.tolist()
    return [flat[start:stop] for start, stop in zip(bounds[:-1], bounds[1:])]
