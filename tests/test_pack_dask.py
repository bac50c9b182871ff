"""``packer.pack(..., executor=client)`` on a real dask LocalCluster (worker processes): the same
bytes as one process, ``fn`` and the inputs shipped with each task."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle  # with dask: the [dask] extra, part of [dev]
import numpy as np
import pytest

import packer
from packer.write.dask_client import dask_client

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this file


def to_sample(i: int) -> dict[str, Any] | None:
    if i == 4:
        raise ValueError("input 4 is broken")
    return (
        {"npy": np.full((i % 5 + 1, 2), i, np.float64), "txt": f"caption {i}"} if i != 9 else None
    )


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    with dask_client("local:2") as running:
        yield running


def test_a_dask_cluster_packs_the_bytes_of_one_process(
    client: Any, tmp_path: Path, tree_files: Any
) -> None:
    here = tmp_path / "here.lmdb"
    packer.pack(range(30), here, to_sample, workers=1, shard_size="300B", progress=False)
    there = tmp_path / "there.lmdb"
    result = packer.pack(
        range(30), there, to_sample, executor=client, shard_size="300B", progress=False
    )
    assert [s.reason for s in result.skipped] == ["ValueError: input 4 is broken"]
    assert len(result.manifest.shards) > 3
    assert tree_files(there) == tree_files(here)
