"""Real DataLoader workers under fork, forkserver and spawn, for every format."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import packer
from packer.tools.image_demo import DemoTree


def expected_pairs(tree: DemoTree) -> Counter:
    return Counter((p.read_bytes(), tree.classes.index(p.parent.name)) for p in tree.good)


def seen_pairs(loader: DataLoader) -> Counter:
    return Counter((data, int(label)) for batch in loader for data, label in batch)


def list_collate(batch: list) -> list:
    return batch


@pytest.mark.parametrize("context", ["fork", "forkserver", "spawn"])
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
    seen = seen_pairs(loader)
    if suffix == ".bmp":  # decoded pixels, not the JPEG bytes: check keys and labels instead
        assert sum(seen.values()) == len(tree.good)
        assert len(seen) == len(tree.good)
    else:
        assert seen == expected_pairs(tree)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_after_parent_read(
    packed: dict[str, Path], tree: DemoTree, suffix: str, context: str
) -> None:
    """The parent reads first (opening its handles), then persistent workers run two epochs."""
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
