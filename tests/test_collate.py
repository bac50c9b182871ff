from __future__ import annotations

import time
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import packer


def test_pack_and_unpack_round_trip() -> None:
    batch = [(b"abc", 1), (b"", 0), (b"\x00\xff" * 1000, 7)]
    data, offsets, labels = packer.collate_bytes(batch)
    assert data.dtype == torch.uint8 and offsets.tolist() == [0, 3, 3, 2003]
    assert labels.tolist() == [1, 0, 7]
    assert [bytes(b) for b in packer.unpack_bytes(data, offsets)] == [b for b, _ in batch]


def test_collate_through_workers_equals_item_access(packed: dict[str, Path]) -> None:
    dataset = packer.open_dataset(packed[".npy"], output="bytes")
    loader = DataLoader(
        dataset,
        batch_size=5,
        num_workers=2,
        multiprocessing_context="forkserver",  # pickled as under spawn, torch not imported again
        collate_fn=packer.collate_bytes,
    )
    got = [
        (bytes(buf), int(y))
        for data, offsets, labels in loader
        for buf, y in zip(packer.unpack_bytes(data, offsets), labels)
    ]
    assert got == [dataset[i] for i in range(len(dataset))]


def _shared_flag(batch: list) -> bool:
    return packer.collate_bytes(batch)[0].is_shared()


def test_worker_batches_are_built_in_shared_memory(packed: dict[str, Path]) -> None:
    """Inside a worker the batch tensor starts in shared memory, so it is not copied again."""
    dataset = packer.open_dataset(packed[".lmdb"], output="bytes")
    assert _shared_flag([dataset[0]]) is False  # main process: ordinary memory
    loader = DataLoader(
        dataset,
        batch_size=4,
        num_workers=1,
        multiprocessing_context="fork",
        collate_fn=_shared_flag,
    )
    assert list(loader) == [True, True, True]


def _buffer_kind(batch: object) -> tuple[str, bool]:
    data = packer.collate_bytes(batch)[0]  # type: ignore[arg-type]
    return type(batch).__name__, data.is_shared()


def test_batch_buffer_reads_straight_into_shared_memory(
    packed: dict[str, Path], suffix: str
) -> None:
    """``batch_buffer=True``: the worker's batch is read into one shared buffer (read_into) that
    collate_bytes hands on as is; any other collate still sees (bytes, label) pairs."""
    dataset = packer.open_dataset(packed[suffix], output="bytes", batch_buffer=True)
    plain = packer.open_dataset(packed[suffix], output="bytes")
    expected = [plain[i] for i in range(len(plain))]
    for ctx in ("fork", "forkserver"):  # forkserver: pickled as under spawn (spawn: below)
        loader = DataLoader(
            dataset,
            batch_size=5,
            num_workers=2,
            multiprocessing_context=ctx,
            collate_fn=packer.collate_bytes,
        )
        got = [
            (bytes(buf), int(y))
            for data, offsets, labels in loader
            for buf, y in zip(packer.unpack_bytes(data, offsets), labels)
        ]
        assert got == expected
    kinds = DataLoader(dataset, batch_size=5, num_workers=1, collate_fn=_buffer_kind)
    assert set(kinds) == {("BytesBatch", True)}
    pairs = DataLoader(dataset, batch_size=4, num_workers=0, collate_fn=list)
    assert [pair for batch in pairs for pair in batch] == expected
    default = next(iter(DataLoader(dataset, batch_size=3)))
    assert list(default[0]) == [b for b, _ in expected[:3]]
    assert default[1].tolist() == [y for _, y in expected[:3]]


def _expected(dataset: Any) -> list[tuple[bytes, int]]:
    return [dataset[i] for i in range(len(dataset))]


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
def test_kept_batches_and_views_outlive_the_slots_reuse(
    packed: dict[str, Path], context: str
) -> None:
    """A worker reads batches straight into its reused shared slots; the training process maps
    them without a copy. A batch kept whole, and the memoryviews of one whose tensors were
    dropped, must still hold their bytes after many later batches (a slot written again while
    anything of it lives would show here)."""
    dataset = packer.open_dataset(packed[".npy"], output="bytes", batch_buffer=True)
    expected = _expected(packer.open_dataset(packed[".npy"], output="bytes"))
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, collate_fn=packer.collate_bytes,
        multiprocessing_context=context,
    )  # fmt: skip
    kept: list[tuple[list[Any], list[int]]] = []
    for k, (data, offsets, labels) in enumerate(loader):
        bounds = offsets.tolist()
        if k % 3 == 0:  # the whole batch kept
            kept.append(([(data, offsets)], labels.tolist()))
        elif k % 3 == 1:  # only unpack_bytes's memoryviews
            kept.append((packer.unpack_bytes(data, offsets), labels.tolist()))
        else:  # only tensor slices, as torchvision.io.decode_jpeg takes them
            kept.append(([data[a:b] for a, b in zip(bounds, bounds[1:])], labels.tolist()))
        del data, offsets
        time.sleep(0.02)  # a slow consumer: the workers run ahead
    got = []
    for parts, labels in kept:
        if isinstance(parts[0], tuple):
            parts = packer.unpack_bytes(*parts[0])
        got += zip(
            [bytes(p) if isinstance(p, memoryview) else p.numpy().tobytes() for p in parts], labels
        )
    assert got == expected


def _slots_reused(batch: Any) -> tuple[bool, bool]:
    """In a worker: is the next batch read into the same slot while the received previous one
    lives (it must not be), and once it is gone (it should)?"""
    import pickle

    first = packer.collate_bytes(batch)
    where = first[0].untyped_storage().data_ptr()
    received = pickle.loads(ForkingPickler.dumps(first))  # as the training process gets it
    del first
    while_kept = packer.collate_bytes(batch)[0].untyped_storage().data_ptr() == where
    del received
    after = packer.collate_bytes(batch)[0].untyped_storage().data_ptr() == where
    return while_kept, after


def test_a_slot_is_reused_only_once_its_batch_is_gone(packed: dict[str, Path]) -> None:
    dataset = packer.open_dataset(packed[".lmdb"], output="bytes")  # each collate packs anew
    loader = DataLoader(dataset, batch_size=4, num_workers=1, collate_fn=_slots_reused)
    assert set(loader) == {(False, True)}


def test_mapped_batches_leave_no_descriptor_behind(packed: dict[str, Path]) -> None:
    """Epoch after epoch of mapped batches (each dropped as the loop goes on), the training
    process holds no more descriptors: a mapping is let go with its batch's last view."""
    import os

    dataset = packer.open_dataset(packed[".npy"], output="bytes", batch_buffer=True)
    loader = DataLoader(
        dataset, batch_size=2, num_workers=2, collate_fn=packer.collate_bytes,
        multiprocessing_context="fork", persistent_workers=True,
    )  # fmt: skip
    counts = []
    for _ in range(4):
        assert sum(len(labels) for _, _, labels in loader) == len(dataset)
        counts.append(len(os.listdir("/proc/self/fd")))
    assert counts[1:] == [counts[1]] * 3, counts
