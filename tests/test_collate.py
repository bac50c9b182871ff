from __future__ import annotations

from pathlib import Path

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
        multiprocessing_context="spawn",
        collate_fn=packer.collate_bytes,
    )
    got = [
        (bytes(buf), int(y))
        for data, offsets, labels in loader
        for buf, y in zip(packer.unpack_bytes(data, offsets), labels)
    ]
    assert got == [dataset[i] for i in range(len(dataset))]
