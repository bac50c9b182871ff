"""ShardedSampler under torchdata's StatefulDataLoader: a checkpoint taken mid-epoch resumes with
nothing to compute by hand — the samples received before and after the resume are one epoch,
exactly once each — with DataLoader workers under fork and spawn, on another number of ranks, and
with persistent workers across an epoch boundary.

Real workers, real LMDB shards; the rank count changes between save and resume (2 → 1, 1 → 2)
because the sampler's order depends only on (seed, epoch), never on the ranks.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import packer

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata


class Keyed:
    """The dataset's samples as their keys (what a training loop would consume)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.shard_of_sample = dataset.shard_of_sample  # the sampler's blocks

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> str:
        self.dataset[i]  # really read it
        return str(self.dataset.keys[i])


def loader(
    dataset: Any, replicas: int, rank: int, workers: int, context: str | None, **kw: Any
) -> Any:
    sampler = packer.ShardedSampler(dataset, num_replicas=replicas, rank=rank, seed=3, block=2)
    return StatefulDataLoader(
        dataset,
        batch_size=2,
        sampler=sampler,
        num_workers=workers,
        multiprocessing_context=context if workers else None,
        collate_fn=list,
        **kw,
    ), sampler


@pytest.fixture(scope="module")
def keyed(packed: dict[str, Path]) -> Keyed:
    return Keyed(packer.open_dataset(packed[".lmdb"], output="bytes"))


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_a_mid_epoch_checkpoint_resumes_exactly(keyed: Keyed, context: str) -> None:
    first, _ = loader(keyed, 1, 0, 2, context)
    seen: list[str] = []
    for step, batch in enumerate(first):
        seen += batch
        if step == 2:
            state = first.state_dict()  # no consumed= to compute: the loader knows
            break
    del first
    again, _ = loader(keyed, 1, 0, 2, context)
    again.load_state_dict(state)
    seen += [key for batch in again for key in batch]
    assert Counter(seen) == Counter(str(k) for k in keyed.dataset.keys)


def test_two_ranks_checkpointed_resume_on_one(keyed: Keyed) -> None:
    """Both ranks stop after the same number of steps; rank 0's state resumes the epoch on one
    rank, which reads exactly what neither rank had received."""
    loaders = [loader(keyed, 2, rank, 2, "fork")[0] for rank in (0, 1)]
    seen: list[str] = []
    iters = [iter(each) for each in loaders]
    for _ in range(2):
        for it in iters:
            seen += next(it)
    state = loaders[0].state_dict()
    del iters, loaders
    one, _ = loader(keyed, 1, 0, 2, "fork")  # torchdata: a multi-worker state resumes with workers
    one.load_state_dict(state)
    seen += [key for batch in one for key in batch]
    assert Counter(seen) == Counter(str(k) for k in keyed.dataset.keys)


def test_persistent_workers_across_an_epoch_boundary(keyed: Keyed) -> None:
    """A checkpoint in epoch 1 of a run with persistent workers resumes epoch 1 exactly, and
    epoch 2 after it is whole again."""
    run, sampler = loader(keyed, 1, 0, 2, "fork", persistent_workers=True)
    sampler.set_epoch(0)
    assert Counter(k for b in run for k in b) == Counter(str(k) for k in keyed.dataset.keys)
    sampler.set_epoch(1)
    seen: list[str] = []
    for step, batch in enumerate(run):
        seen += batch
        if step == 1:
            state = run.state_dict()
            break
    del run
    resumed, sampler = loader(keyed, 1, 0, 2, "fork", persistent_workers=True)
    resumed.load_state_dict(state)
    seen += [key for batch in resumed for key in batch]
    assert Counter(seen) == Counter(str(k) for k in keyed.dataset.keys)
    sampler.set_epoch(2)
    assert Counter(k for b in resumed for k in b) == Counter(str(k) for k in keyed.dataset.keys)
