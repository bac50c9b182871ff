"""Issue 42 item 4: a dataset at a URL read without the shard cache in a scattered order warns,
once, naming ShardedSampler and cache_dir; in order, with ShardedSampler, through the cache or
locally it does not."""

from __future__ import annotations

import random
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import packer
from packer.read.scatter import WINDOW

BUCKET = "scatter"


@pytest.fixture(scope="module")
def remote(server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    local = tmp_path_factory.mktemp("scatter") / "many.npy"
    packer.pack(
        range(3 * WINDOW), local, lambda i: {"cls": i}, shard_size="2kB", workers=1, progress=False
    )
    return server.upload(local, "many.npy"), local


def _read(ds: Any, order: Any) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in order:
            assert ds[i]["cls"] == i
    return [w for w in caught if issubclass(w.category, UserWarning)]


def test_shuffled_uncached_reads_warn_once_with_the_fixes(
    remote: tuple[str, Path], server: Any
) -> None:
    url, _ = remote
    ds = packer.open_dataset(url, storage_options=server.options)
    order = list(range(len(ds)))
    random.Random(0).shuffle(order)
    caught = _read(ds, order + order)
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "ShardedSampler" in text and "cache_dir" in text and url in text


def test_in_order_and_sharded_sampler_reads_do_not_warn(
    remote: tuple[str, Path], server: Any
) -> None:
    url, local = remote
    ds = packer.open_dataset(url, storage_options=server.options)
    assert _read(ds, range(len(ds))) == []
    sampler = packer.ShardedSampler(ds, shuffle=True, seed=1)
    assert _read(ds, list(sampler)) == []
    shuffled = np.random.default_rng(2).permutation(len(ds)).tolist()
    assert _read(packer.open_dataset(local), shuffled) == []


def test_cached_reads_do_not_warn(remote: tuple[str, Path], server: Any, tmp_path: Path) -> None:
    url, _ = remote
    ds = packer.open_dataset(url, storage_options=server.options, cache_dir=tmp_path / "cache")
    shuffled = np.random.default_rng(3).permutation(len(ds)).tolist()
    assert _read(ds, shuffled) == []


def test_a_shuffled_dataloader_batch_path_warns_too(remote: tuple[str, Path], server: Any) -> None:
    url, _ = remote
    ds = packer.open_dataset(url, storage_options=server.options, fields=("cls",))
    loader = DataLoader(
        ds, batch_size=32, shuffle=True, num_workers=0, collate_fn=packer.collate_fields
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        labels = sorted(int(v) for (batch,) in loader for v in batch)
    assert labels == list(range(len(ds)))
    assert sum("ShardedSampler" in str(w.message) for w in caught) == 1


def test_doctor_on_the_url_gives_the_same_advice(remote: tuple[str, Path], server: Any) -> None:
    from packer.diagnosis.doctor_remote import doctor_remote

    url, _ = remote
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = doctor_remote(url, server.options, step_ms=10, batch_size=8, probes=2)
    (line,) = [r for r in report.recommendations if "ShardedSampler" in r]
    assert "not DataLoader(shuffle=True)" in line and "cache_dir" in line
    assert not [w for w in caught if "ShardedSampler" in str(w.message)]  # doctor reads knowingly
