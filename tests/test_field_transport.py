"""Encoded fields sent from DataLoader workers through reused shared memory
(``packer.read.transport``): the training process gets plain lists of ``bytes`` equal to the
source under every start method, a batch it keeps is never overwritten by a later one, the
bytes do not go through the pipe, and a receiver that frees no slot still gets exact data."""

from __future__ import annotations

import pickle
import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader, Dataset

import packer
from packer.demo.fields import make_caption_set
from packer.read import transport

Samples = dict[str, dict[str, bytes]]


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Samples]:
    """48 photo-sized samples (~80 KB each): a batch of 8 is well over the inline size."""
    root = tmp_path_factory.mktemp("photos")
    written = make_caption_set(root / "src", samples=48, size=(400, 350), seed=3)
    return packer.convert(root / "src", root / "p.lmdb", progress=False).dst, written


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_kept_batches_arrive_equal_to_the_source(
    context: str, photos: tuple[Path, Samples]
) -> None:
    root, written = photos
    ds = packer.open_dataset(root, fields=("jpg", "txt", "json"), output="bytes")
    loader = DataLoader(
        ds, batch_size=8, shuffle=True, num_workers=2, collate_fn=packer.collate_fields,
        multiprocessing_context=context,
    )  # fmt: skip
    kept = []
    for batch in loader:  # a slow consumer: the workers run ahead, their slots in use
        kept.append(batch)
        time.sleep(0.05)
    got: dict[bytes, tuple[bytes, bytes | None]] = {}
    for jpgs, txts, metas in kept:  # read only now: a slot reused early would show here
        assert type(jpgs) is list and all(type(j) is bytes for j in jpgs)
        got.update({j: (t, m) for j, t, m in zip(jpgs, txts, metas)})
    want = {f["jpg"]: (f["txt"], f.get("json")) for f in written.values()}
    assert got == want
    assert sum(len(j) for j, _, _ in kept) == len(written)


def _pickled_size(batch: list[tuple[bytes, ...]]) -> tuple[int, int]:
    """In a worker: the bytes of the collated batch and of its pickle for the main process."""
    collated = packer.collate_fields(batch)
    size = len(ForkingPickler.dumps(collated))
    pickle.loads(ForkingPickler.dumps(collated))  # received: its slot is free again
    return sum(len(b) for b in collated[0]), size


def test_the_bytes_do_not_go_through_the_pipe(photos: tuple[Path, Samples]) -> None:
    ds = packer.open_dataset(photos[0], fields=("jpg", "txt"), output="bytes")
    loader = DataLoader(
        ds, batch_size=8, num_workers=1, collate_fn=_pickled_size, multiprocessing_context="fork"
    )
    for payload, pickled in loader:
        assert payload > transport.INLINE_BYTES
        assert pickled < 8192  # the slot's descriptor, lengths and captions, not 600 KB


class _Blobs(Dataset):
    """Large blobs with holes (``None``), as an optional image field reads."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> tuple[bytes | None]:
        return (None if i % 3 == 1 else bytes([i]) * (100_000 + i),)


def _unreceived(batch: list[tuple[bytes | None]]) -> bool:
    """In a worker: more sends than slots before any is received, then each received."""
    column = packer.collate_fields(batch)[0]
    turns = [column[k:] + column[:k] for k in range(transport.SLOTS + 3)]  # each its own bytes
    sent = [ForkingPickler.dumps(type(column)(turn)) for turn in turns]
    return [pickle.loads(s) for s in sent] == turns


def test_holes_and_a_receiver_that_frees_no_slot() -> None:
    kept = list(DataLoader(_Blobs(), batch_size=6, num_workers=2, collate_fn=packer.collate_fields))
    flat = [b for (column,) in kept for b in column]
    assert flat == [_Blobs()[i][0] for i in range(24)]
    assert flat[1] is None and flat[0] == b"\x00" * 100_000
    loader = DataLoader(_Blobs(), batch_size=6, num_workers=1, collate_fn=_unreceived)
    assert list(loader) == [True] * 4


def _no_shared_memory(worker: int) -> None:
    import torch

    def full(size: int) -> None:
        raise RuntimeError(f"unable to allocate shared memory(shm) for file: {size}")

    torch.UntypedStorage._new_shared = full  # type: ignore[method-assign]  # as /dev/shm full


def test_without_shared_memory_the_pipe_carries_the_batch() -> None:
    loader = DataLoader(
        _Blobs(), batch_size=6, num_workers=2, collate_fn=packer.collate_fields,
        worker_init_fn=_no_shared_memory, multiprocessing_context="fork", timeout=20,
    )  # fmt: skip
    assert [b for (column,) in loader for b in column] == [_Blobs()[i][0] for i in range(24)]


def test_in_the_main_process_a_plain_list(photos: tuple[Path, Samples]) -> None:
    ds = packer.open_dataset(photos[0], fields=("jpg",), output="bytes")
    (jpgs,) = packer.collate_fields(ds.__getitems__(list(range(8))))
    assert type(jpgs) is list and len(ForkingPickler.dumps(jpgs)) > sum(map(len, jpgs))


def test_file_system_sharing_strategy_and_descriptors_stay_flat() -> None:
    """Under torch's ``file_system`` strategy (named segments, a common fix for "too many open
    files") the columns arrive exact; epoch after epoch, the receiver holds no more
    descriptors (a slot mapped per batch and not let go would show)."""
    import os

    import torch.multiprocessing as tmp

    want = [_Blobs()[i][0] for i in range(24)]
    before = tmp.get_sharing_strategy()
    try:
        for strategy in ("file_system", "file_descriptor"):
            tmp.set_sharing_strategy(strategy)
            loader = DataLoader(
                _Blobs(), batch_size=6, num_workers=2, collate_fn=packer.collate_fields,
                multiprocessing_context="fork", persistent_workers=True,
            )  # fmt: skip
            counts = []
            for _ in range(4):
                assert [b for (column,) in loader for b in column] == want, strategy
                counts.append(len(os.listdir("/proc/self/fd")))
            assert counts[1:] == [counts[1]] * 3, (strategy, counts)
            del loader
    finally:
        tmp.set_sharing_strategy(before)


def _two_threads_never_share_a_slot(batch: Any) -> int:
    """In a worker: two threads take slots, fill them with their own byte, check it and hand the
    slot back, 300 times each; returns how many checks found another thread's bytes."""
    import threading

    collisions = [0]

    def hammer(mark: int) -> None:
        for _ in range(300):
            data = transport.shared_bytes(4096)
            assert data is not None
            data.fill_(mark)
            time.sleep(0)  # let the other thread run between the fill and the check
            collisions[0] += int((data != mark).any())
            transport._free(data.untyped_storage())

    threads = [threading.Thread(target=hammer, args=(m,)) for m in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return collisions[0]


def test_threads_of_a_worker_never_take_the_same_slot() -> None:
    """A worker's queue thread pickles columns into slots while its main thread reads batches
    into others: taking a slot is one step for the threads of a process."""
    loader = DataLoader(
        _Blobs(), batch_size=24, num_workers=1, collate_fn=_two_threads_never_share_a_slot,
        multiprocessing_context="fork",
    )  # fmt: skip
    assert list(loader) == [0]
