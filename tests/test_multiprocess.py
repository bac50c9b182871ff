"""Real DataLoader workers under fork, forkserver and spawn, for every format (spawn: the four
formats in one loader, so that its workers, each importing torch afresh, start once)."""

from __future__ import annotations

import bisect
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import ConcatDataset, DataLoader, Dataset

import packer
from packer.demo.image import DemoTree

SUFFIXES = [".bmp", ".h5", ".lmdb", ".npy"]  # one per format (conftest's)


def expected_pairs(tree: DemoTree) -> Counter:
    return Counter((p.read_bytes(), tree.classes.index(p.parent.name)) for p in tree.good)


def seen_pairs(loader: DataLoader) -> Counter:
    return Counter((data, int(label)) for batch in loader for data, label in batch)


def list_collate(batch: list) -> list:
    return batch


class Tagged(Dataset):
    """Several datasets in one: item ``i`` is ``(which dataset, its item)``."""

    def __init__(self, datasets: list[Any]) -> None:
        self.parts = ConcatDataset(datasets)

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, i: int) -> tuple[int, Any]:
        return bisect.bisect_right(self.parts.cumulative_sizes, i), self.parts[i]


def check_every_sample_once(seen: Counter, tree: DemoTree, suffix: str) -> None:
    if suffix == ".bmp":  # decoded pixels, not the JPEG bytes: check keys and labels instead
        assert sum(seen.values()) == len(tree.good)
        assert len(seen) == len(tree.good)
    else:
        assert seen == expected_pairs(tree), suffix


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_workers_see_every_sample_once(
    packed: dict[str, Path], tree: DemoTree, suffix: str, context: str
) -> None:
    dataset = packer.open_dataset(packed[suffix], output="bytes")
    loader = DataLoader(
        dataset,
        batch_size=5,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=list_collate,
    )
    check_every_sample_once(seen_pairs(loader), tree, suffix)


def spawned_loader(packed: dict[str, Path], **options: Any) -> tuple[list[Any], DataLoader]:
    datasets = [packer.open_dataset(packed[s], output="bytes") for s in SUFFIXES]
    loader = DataLoader(
        Tagged(datasets),
        shuffle=True,
        num_workers=2,
        multiprocessing_context="spawn",
        collate_fn=list_collate,
        **options,
    )
    return datasets, loader


def seen_by_format(loader: DataLoader) -> list[Counter]:
    seen = [Counter() for _ in SUFFIXES]
    for batch in loader:
        for which, (data, label) in batch:
            seen[which][(data, int(label))] += 1
    return seen


def test_spawned_workers_see_every_sample_once_in_every_format(
    packed: dict[str, Path], tree: DemoTree
) -> None:
    """Every format's dataset pickled into spawned workers (one loader over the four)."""
    _, loader = spawned_loader(packed, batch_size=5)
    for suffix, seen in zip(SUFFIXES, seen_by_format(loader)):
        check_every_sample_once(seen, tree, suffix)


def test_persistent_spawned_workers_after_parent_read_in_every_format(
    packed: dict[str, Path],
) -> None:
    """As below, every format in one loader of persistent spawned workers."""
    datasets, loader = spawned_loader(packed, batch_size=4, persistent_workers=True)
    first = [[d[i] for i in range(len(d))] for d in datasets]  # the parent reads first
    for _ in range(2):
        assert seen_by_format(loader) == [Counter((d, int(y)) for d, y in f) for f in first]
    assert [[d[i] for i in range(len(d))] for d in datasets] == first  # parent handles good


@pytest.mark.parametrize("context", ["fork"])
def test_persistent_workers_after_parent_read(
    packed: dict[str, Path], tree: DemoTree, suffix: str, context: str
) -> None:
    """The parent reads first (opening its handles), then persistent workers run two epochs
    (spawn: every format in one loader, above)."""
    dataset = packer.open_dataset(packed[suffix], output="bytes")
    first = [dataset[i] for i in range(len(dataset))]
    loader = DataLoader(
        dataset,
        batch_size=4,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
        collate_fn=list_collate,
    )
    for _ in range(2):
        assert seen_pairs(loader) == Counter((d, int(y)) for d, y in first)
    assert [dataset[i] for i in range(len(dataset))] == first  # parent handles still good


def test_decoded_tensors_through_workers(packed: dict[str, Path]) -> None:
    dataset = packer.open_dataset(packed[".lmdb"], output="tensor")
    loader = DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork")
    shapes = [tuple(images.shape) for images, _ in loader]
    assert shapes == [(4, 3, 48, 64)] * 3
