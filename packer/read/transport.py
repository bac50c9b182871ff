"""Columns of ``bytes`` sent from a DataLoader worker through reused shared memory.

A DataLoader worker sends each batch to the training process by pickling it through a pipe.
A batch of 64 images of 80 KB is 5 MB, and the pipe moves about 650 MB/s on a 2-core machine
(``benchmarks/fields_read.py``): for encoded images that is the wall, not the reading. A tensor
goes through shared memory instead, but a new segment per batch pays a page fault per 4 KB
twice (zero-filled in the worker, mapped in the receiver), which is no faster.

:class:`BytesColumn` is a ``list`` of ``bytes`` (or ``None``) that a worker's collate returns
for a column of encoded fields. In the worker it is an ordinary list. When it is pickled there
to be sent, its items are copied into a *slot*: a shared-memory buffer of this worker that is
reused batch after batch, so its pages are faulted in once. The receiving process copies the
items out of the slot into plain ``bytes`` as it unpickles them (it gets a plain ``list``: the
same type and values as the pipe would give) and then marks the slot free. A slot is written
again only once it is marked free: a batch kept by the training loop, or one still queued,
never shares memory with one being made. Slots still busy when a batch is sent mean a new
buffer, used once; a column under :data:`INLINE_BYTES`, or one for which no shared memory
can be had, is pickled inline.

:class:`SharedBatch` does the same for ``collate_bytes``'s ``(data, offsets, labels)`` without
the copy out: the worker reads the batch straight into a slot (:func:`shared_bytes`), the
receiver's ``data`` tensor maps it, and the slot is free again once that tensor and every view
of it (``unpack_bytes``'s memoryviews included) are gone.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

__all__ = ["BytesColumn", "SharedBatch", "bytes_column", "shared_bytes"]

# A column smaller than this (captions, class names) is pickled inline: passing a descriptor
# costs more than copying it through the pipe.
INLINE_BYTES = 256 << 10
# Reused slots per worker process: a worker has at most ``prefetch_factor`` (default 2) batches
# queued and one being made; more busy slots than this means a receiver that keeps none free.
SLOTS = 4
# byte 0 of a slot: BUSY from when it is taken until the receiver is done with it (a column
# copied out, or a mapped batch's last view gone), FREE after; the data starts at HEADER
HEADER = 64
FREE, BUSY = 0, 1

_pool: dict[str, Any] = {"pid": None, "slots": [], "lock": threading.Lock()}


def _new_slot(size: int) -> torch.UntypedStorage:
    storage = torch.UntypedStorage._new_shared(HEADER + size)
    _view(storage)[0] = FREE
    return storage


def _pooled(storage: torch.UntypedStorage) -> bool:
    return any(storage.data_ptr() == s.data_ptr() for s in _pool["slots"])


def _view(storage: torch.UntypedStorage) -> np.ndarray:
    return torch.empty(0, dtype=torch.uint8).set_(storage).numpy()


def _slot(size: int) -> torch.UntypedStorage:
    """A free slot of this process holding at least ``size`` bytes, marked busy. Threads take
    turns: a worker's queue thread pickles columns while its main thread reads batches."""
    if _pool["pid"] != os.getpid():  # a forked child does not inherit its parent's slots
        _pool.update(pid=os.getpid(), slots=[], lock=threading.Lock())
    with _pool["lock"]:
        return _take(_pool["slots"], size)


def _take(slots: list[torch.UntypedStorage], size: int) -> torch.UntypedStorage:
    for k, storage in enumerate(slots):
        if _view(storage)[0] != FREE:
            continue
        if storage.nbytes() < HEADER + size:
            storage = slots[k] = _new_slot(_rounded(size))
        break
    else:
        joins = len(slots) < SLOTS  # a one-off buffer (every slot busy) is made to measure
        storage = _new_slot(_rounded(size) if joins else size)
        if joins:
            slots.append(storage)
    _view(storage)[0] = BUSY
    return storage


def _rounded(size: int) -> int:
    """Room for ``size`` bytes with a quarter to spare, in whole MB: a slot is not remade for a
    batch a few bytes larger than the last."""
    return -(-(size + size // 4) // (1 << 20)) << 20


class BytesColumn(list[bytes | None]):
    """A batch's column of ``bytes`` (``None`` where a sample lacks the field): a plain list in
    the worker; pickled, its bytes travel through a reused shared-memory slot (module
    docstring) and it unpickles as a plain ``list`` equal to this one."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        present = [b for b in self if b is not None]
        total = sum(len(b) for b in present)
        if total < INLINE_BYTES or get_worker_info() is None:
            return list, (list(self),)
        lengths = np.array([-1 if b is None else len(b) for b in self], dtype=np.int64)
        try:
            storage = _slot(total)
        except (RuntimeError, OSError):  # no shared memory (/dev/shm full): the pipe then,
            return list, (list(self),)  # never an error in the queue's thread (a hang)
        view, at = _view(storage), HEADER
        for blob in present:
            view[at : at + len(blob)] = np.frombuffer(blob, dtype=np.uint8)
            at += len(blob)
        return _received, (storage, lengths)


def _received(storage: torch.UntypedStorage, lengths: np.ndarray) -> list[bytes | None]:
    """The column out of its slot (in the receiving process), then the slot marked free."""
    view = _view(storage)
    flat = memoryview(view)  # type: ignore[arg-type]
    out: list[bytes | None] = []
    at = HEADER
    for n in lengths.tolist():
        if n < 0:
            out.append(None)
        else:
            out.append(flat[at : at + n].tobytes())
            at += n
    view[0] = FREE
    return out


def bytes_column(values: list[Any]) -> list[Any] | None:
    """``values`` as a :class:`BytesColumn` when they are ``bytes`` (``None`` allowed, at least
    one ``bytes``) and this is a DataLoader worker; ``None`` otherwise."""
    if get_worker_info() is None or not any(type(v) is bytes for v in values):
        return None
    if not all(v is None or type(v) is bytes for v in values):
        return None
    return BytesColumn(values)


def shared_bytes(size: int) -> torch.Tensor | None:
    """In a DataLoader worker, a uint8 tensor of ``size`` bytes in a free slot of this worker
    (marked busy until a receiver of the :class:`SharedBatch` holding it lets it go); ``None``
    in the main process or when no shared memory can be had."""
    if get_worker_info() is None:
        return None
    try:
        storage = _slot(size)
    except (RuntimeError, OSError):
        return None
    return torch.empty(0, dtype=torch.uint8).set_(storage, HEADER, (size,), (1,))


class SharedBatch(tuple[Any, ...]):
    """``(data, ...)``, a batch whose first item may lie in a slot (:func:`shared_bytes`): a
    plain tuple in the worker; pickled, the receiver's ``data`` maps the slot without a copy,
    and the slot is marked free only when the last tensor or view of it is gone (a batch the
    training loop keeps is never overwritten). Anything else pickles as a plain tuple."""

    def __reduce_ex__(self, protocol: Any) -> Any:
        data, *rest = self
        storage = data.untyped_storage()
        if get_worker_info() is None or not _pooled(storage):
            return tuple, (tuple(self),)
        return _received_batch, (storage, data.storage_offset(), data.numel(), *rest)


def _received_batch(
    storage: torch.UntypedStorage, offset: int, size: int, *rest: Any
) -> tuple[Any, ...]:
    region = _view(storage)[offset : offset + size]
    # the tensor keeps ``region`` alive, and every view of the tensor its storage: ``region``
    # dies with the last of them, and only then is the slot free for the worker again
    weakref.finalize(region, _free, storage)
    return (torch.from_numpy(region), *rest)


def _free(storage: torch.UntypedStorage) -> None:
    _view(storage)[0] = FREE
