"""ShardedSampler's logic without a process group: every rank is a sampler with its own rank."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

import packer
from packer.demo.image import DemoTree
from packer.demo.video import make_video_tree
from packer.errors import PackerError
from packer.read.sampler import ShardedSampler, block_starts, epoch_order
from packer.write.convert import convert_video


class Sized:
    """A stand-in dataset: only its length matters to a sampler."""

    def __init__(self, n: int, shards: np.ndarray | None = None) -> None:
        self.n, self.shards = n, shards

    def __len__(self) -> int:
        return self.n

    def shard_of_sample(self) -> np.ndarray | None:
        return self.shards


def shares(n: int, replicas: int, **kwargs: object) -> list[list[int]]:
    return [list(ShardedSampler(Sized(n), replicas, r, **kwargs)) for r in range(replicas)]  # type: ignore[arg-type]


def check_split(n: int, got: list[list[int]], replicas: int, drop_last: bool) -> None:
    """Equal counts; disjoint apart from padding; the union is the dataset (or all but a tail
    shorter than ``replicas`` with drop_last)."""
    assert len({len(s) for s in got}) == 1
    seen = Counter(i for s in got for i in s)
    if drop_last:
        assert max(seen.values(), default=1) == 1
        assert len(seen) == n // replicas * replicas
    else:
        assert set(seen) == set(range(n))
        assert sum(seen.values()) - n == -n % replicas  # the padding, and nothing else repeated


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(0, 300),
    replicas=st.integers(1, 7),
    block=st.integers(1, 64),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    mix=st.integers(1, 4),
    epoch=st.integers(0, 5),
)
def test_ranks_split_the_epoch(
    n: int, replicas: int, block: int, drop_last: bool, shuffle: bool, mix: int, epoch: int
) -> None:
    samplers = [
        ShardedSampler(Sized(n), replicas, r, shuffle, 3, drop_last, block, mix)  # type: ignore[arg-type]
        for r in range(replicas)
    ]
    for s in samplers:
        s.set_epoch(epoch)
    got = [list(s) for s in samplers]
    assert all(len(g) == len(s) for g, s in zip(got, samplers))
    check_split(n, got, replicas, drop_last)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 400), block=st.integers(1, 50), seed=st.integers(-5, 2**40))
def test_blocks_are_contiguous_runs(n: int, block: int, seed: int) -> None:
    order = ShardedSampler(Sized(n), 1, 0, seed=seed, block=block).order()
    assert sorted(order.tolist()) == list(range(n))
    runs = order // block  # each block's samples form one run of the global order
    changes = np.flatnonzero(runs[1:] != runs[:-1]) + 1
    assert len(changes) + 1 == -(-n // block)
    for run in np.split(order, changes):
        b = run[0] // block
        assert sorted(run.tolist()) == list(range(b * block, min(n, (b + 1) * block)))


def test_shard_layout_gives_the_blocks() -> None:
    shards = np.repeat([0, 1, 2, 3], [5, 1, 7, 3])
    sampler = ShardedSampler(Sized(16, shards), 1, 0)  # type: ignore[arg-type]
    assert sampler.starts.tolist() == [0, 5, 6, 13]
    order = sampler.order()
    runs = shards[order]
    assert (np.diff(runs) != 0).sum() == 3  # one run per shard
    assert ShardedSampler(Sized(16, shards), 1, 0, block=4).starts.tolist() == [0, 4, 8, 12]
    assert block_starts(10).tolist() == [0] and block_starts(0, None, np.zeros(0)).size == 0


def test_mix_shuffles_groups_of_blocks() -> None:
    order = ShardedSampler(Sized(400), 1, 0, block=10, mix=4).order()
    groups = [set((order[i : i + 40] // 10).tolist()) for i in range(0, 400, 40)]
    assert all(len(g) == 4 for g in groups)  # 4 whole blocks per run of 40
    assert set().union(*groups) == set(range(40))
    assert (np.diff(order[:40] // 10) != 0).sum() > 3  # their samples interleaved


def test_deterministic_and_epochs_differ() -> None:
    a, b = (ShardedSampler(Sized(1000), 2, 1, seed=7, block=10) for _ in range(2))
    assert list(a) == list(b)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first and sorted(a.order()) == list(range(1000))
    a.set_epoch(0)
    assert list(a) == first
    other_seed = ShardedSampler(Sized(1000), 2, 1, seed=8, block=10)
    assert list(other_seed) != first
    assert epoch_order(5, block_starts(5, 2), 0, 0, shuffle=False).tolist() == [0, 1, 2, 3, 4]


def test_no_shuffle_is_plain_order() -> None:
    assert shares(10, 3, shuffle=False) == [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
    assert shares(10, 3, shuffle=False, drop_last=True) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]


def run_until(sampler: ShardedSampler, k: int) -> list[int]:
    it = iter(sampler)
    return [next(it) for _ in range(k)]


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 200),
    before=st.integers(1, 4),
    after=st.integers(1, 4),
    block=st.integers(1, 30),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_resume_on_any_number_of_ranks(
    n: int, before: int, after: int, block: int, drop_last: bool, data: st.DataObject
) -> None:
    """Stop every rank after k samples, save, resume on another number of ranks: the samples
    seen before and after make exactly one epoch, apart from padding (or the dropped tail)."""
    old = [
        ShardedSampler(Sized(n), before, r, seed=5, drop_last=drop_last, block=block)  # type: ignore[arg-type]
        for r in range(before)
    ]
    for s in old:
        s.set_epoch(2)
    k = data.draw(st.integers(0, len(old[0])), label="k")
    seen_before = [i for s in old for i in run_until(s, k)]
    states = [s.state_dict(consumed=k) for s in old]
    assert all(state == states[0] for state in states)  # save it from any rank
    new = [
        ShardedSampler(Sized(n), after, r, seed=5, drop_last=drop_last, block=block)  # type: ignore[arg-type]
        for r in range(after)
    ]
    for s in new:
        s.load_state_dict(states[0])
        s.set_epoch(2)  # the loop's set_epoch of the resumed epoch keeps the resume point
    lengths = [len(s) for s in new]  # a whole epoch's, also after a resume
    rest = [list(s) for s in new]
    assert lengths == [len(ShardedSampler(Sized(n), after, 0, drop_last=drop_last))] * after  # type: ignore[arg-type]
    assert len({len(r) for r in rest}) == 1
    order = old[0].order().tolist()
    start = states[0]["consumed"]
    assert sorted(set(seen_before)) == sorted(order[: min(k * before, n)])
    seen = Counter(seen_before + [i for r in rest for i in r])
    if drop_last:
        assert max(seen.values(), default=1) == 1
        # the tail left out: the old run's if it finished the epoch, else the new run's
        tail = order[k * before :] if start == n else order[n - (n - start) % after :]
        assert set(range(n)) - set(seen) == set(tail)
    else:
        assert set(seen) == set(range(n))
        # a save inside the epoch leaves no padding before it; after it, the last split pads
        padding = -n % before if start == n and k else -(n - start) % after
        assert sum(seen.values()) - n == padding


def test_state_without_consumed_counts_what_was_handed_out() -> None:
    sampler = ShardedSampler(Sized(50), 2, 0, block=8)
    loader = DataLoader(range(50), batch_size=4, sampler=sampler, num_workers=0)
    for step, _ in enumerate(loader):
        if step == 2:
            break
    assert sampler.state_dict() == sampler.state_dict(consumed=12)
    assert sampler.state_dict()["consumed"] == 24


def test_resume_point_serves_its_epoch_once() -> None:
    sampler = ShardedSampler(Sized(20), 1, 0, block=4)
    state = sampler.state_dict(consumed=15)
    sampler.load_state_dict(state)
    assert len(sampler) == 20  # the epoch's length, though 5 remain
    tail = list(sampler)
    assert tail == sampler.order()[15:].tolist()
    assert sampler.state_dict() == {**state, "consumed": 20}  # the epoch is done
    assert len(list(sampler)) == 20  # the next pass over the same epoch is a whole one
    sampler.load_state_dict(state)
    sampler.set_epoch(1)  # another epoch starts at its beginning
    assert len(sampler) == 20 and len(list(sampler)) == 20
    done = sampler.state_dict()
    sampler.load_state_dict(done)
    assert list(sampler) == [] and len(sampler) == 20


def test_state_is_checked() -> None:
    sampler = ShardedSampler(Sized(20), 2, 0, block=4)
    state = sampler.state_dict(consumed=3)
    for changed in (
        ShardedSampler(Sized(21), 2, 0, block=4),
        ShardedSampler(Sized(20), 2, 0, block=5),
        ShardedSampler(Sized(20), 2, 0, block=4, seed=1),
        ShardedSampler(Sized(20), 2, 0, block=4, mix=2),
        ShardedSampler(Sized(20), 2, 0, block=4, shuffle=False),
    ):
        with pytest.raises(PackerError, match="resuming would repeat and skip"):
            changed.load_state_dict(state)
    ShardedSampler(Sized(20), 3, 2, block=4).load_state_dict(state)  # other ranks are fine
    with pytest.raises(PackerError, match="more than the 10 samples"):
        sampler.state_dict(consumed=11)
    with pytest.raises(PackerError, match="not a ShardedSampler state"):
        sampler.load_state_dict({"epoch": 1})
    with pytest.raises(PackerError, match="past the epoch"):
        sampler.load_state_dict({**state, "consumed": 21})


def test_arguments_are_checked() -> None:
    assert (ShardedSampler(Sized(3)).num_replicas, ShardedSampler(Sized(3)).rank) == (1, 0)
    bad = [
        ({"num_replicas": 0, "rank": 0}, "num_replicas must be at least 1"),
        ({"num_replicas": 2}, "rank= is required"),
        ({"num_replicas": 2, "rank": 2}, "rank 2 is out of range"),
        ({"num_replicas": 2, "rank": -1}, "rank must be at least 0"),
        ({"block": 0}, "block must be at least 1"),
        ({"mix": 0}, "mix must be at least 1"),
        ({"run": 0}, "run must be at least 1"),
        ({"seed": 1.5}, "seed must be an integer"),
        ({"num_replicas": True, "rank": 0}, "num_replicas must be an integer"),
    ]
    for kwargs, message in bad:
        with pytest.raises(PackerError, match=message):
            ShardedSampler(Sized(3), **kwargs)  # type: ignore[arg-type]
    with pytest.raises(PackerError, match="epoch must be an integer"):
        ShardedSampler(Sized(3)).set_epoch("1")  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 300),
    block=st.integers(1, 64),
    run=st.integers(1, 20),
    mix=st.integers(1, 3),
    epoch=st.integers(0, 3),
)
def test_runs_stay_together(n: int, block: int, run: int, mix: int, epoch: int) -> None:
    """With ``run=k`` each block's runs of k consecutive samples come whole, one after another
    (a URL read without the cache fetches each by one GET), and the epoch is every sample once."""
    starts = block_starts(n, block)
    order = epoch_order(n, starts, 3, epoch, mix=mix, run=run)
    assert sorted(order.tolist()) == list(range(n))
    block_of = np.searchsorted(starts, order, side="right") - 1
    run_of = block_of * (block + run) + (order - starts[block_of]) // run  # unique per run
    changes = int((np.diff(run_of) != 0).sum())
    assert changes == len(set(run_of.tolist())) - 1 if n else changes == 0


def test_a_run_of_one_is_the_order_of_before() -> None:
    """run=1 (every local dataset's default) keeps the order, and so the states, of before."""
    import zlib

    order = epoch_order(1000, block_starts(1000, 37), 5, 3, mix=2)
    assert zlib.crc32(order.tobytes()) == 1641045896  # computed by the sampler before runs
    assert (epoch_order(1000, block_starts(1000, 37), 5, 3, mix=2, run=1) == order).all()
    ordered = epoch_order(100, block_starts(100, 30), 1, 0, run=4)
    assert (ordered != epoch_order(100, block_starts(100, 30), 1, 0)).any()
    state = ShardedSampler(Sized(20), 1, 0, block=4).state_dict()
    assert "run" not in state  # a state saved before runs existed still loads
    with pytest.raises(PackerError, match="has no run"):
        ShardedSampler(Sized(20), 1, 0, block=4, run=3).load_state_dict(state)
    runs = ShardedSampler(Sized(20), 1, 0, block=4, run=3).state_dict()
    with pytest.raises(PackerError, match="saved with run=3, this sampler has run=2"):
        ShardedSampler(Sized(20), 1, 0, block=4, run=2).load_state_dict(runs)
    with pytest.raises(PackerError, match="saved with run=3, this sampler has run=1"):
        ShardedSampler(Sized(20), 1, 0, block=4).load_state_dict(runs)


class Mixed(Sized):
    """A stand-in dataset whose order has an input of its own (as a Mixture's seed)."""

    def state_fingerprint(self) -> dict[str, int]:
        return {"mixture_seed": 5}


def test_a_state_with_order_inputs_this_sampler_lacks_is_refused() -> None:
    """A state saved over a dataset with its own order inputs (a Mixture) is refused by a
    sampler over a dataset without them, as the other way round: the orders differ."""
    state = ShardedSampler(Mixed(20), 1, 0, block=4).state_dict(consumed=5)
    with pytest.raises(PackerError, match="saved with mixture_seed=5, this sampler has "):
        ShardedSampler(Sized(20), 1, 0, block=4).load_state_dict(state)
    plain = ShardedSampler(Sized(20), 1, 0, block=4).state_dict(consumed=5)
    with pytest.raises(PackerError, match="the sampler state has no mixture_seed"):
        ShardedSampler(Mixed(20), 1, 0, block=4).load_state_dict(plain)
    ShardedSampler(Mixed(20), 1, 0, block=4).load_state_dict(state)  # the same order: loads


def test_packer_exports_it() -> None:
    assert packer.ShardedSampler is ShardedSampler and "ShardedSampler" in packer.__all__


def keys_through(dataset: object, sampler: object) -> list[int]:
    loader = DataLoader(dataset, batch_size=3, sampler=sampler, collate_fn=lambda b: b)  # type: ignore[arg-type]
    return [y for batch in loader for _, y in batch]


@pytest.fixture(scope="module")
def videos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tree = make_video_tree(tmp_path_factory.mktemp("vsrc") / "frames", per_class=3)
    out = tmp_path_factory.mktemp("vpacked")
    result = {"folder": tree.root}
    for suffix in (".lmdb", ".npy"):
        result[suffix] = out / f"frames{suffix}"
        convert_video(tree.root, result[suffix], shard_size="40kB", workers=1, progress=False)
    return result


def test_every_dataset_works_with_distributed_sampler(
    packed: dict[str, Path], tree: DemoTree, videos: dict[str, Path]
) -> None:
    """DistributedSampler and ShardedSampler over each format, a folder and clip datasets: the
    ranks' samples (told apart by index) are disjoint apart from padding and cover the dataset."""
    for root in [*packed.values(), tree.root, *videos.values()]:
        dataset = packer.open_dataset(root, output="bytes")
        for make in (DistributedSampler, ShardedSampler):
            samplers = [make(dataset, num_replicas=3, rank=r, shuffle=True) for r in range(3)]
            check_split(len(dataset), [list(s) for s in samplers], 3, False)
            read = keys_through(dataset, samplers[0])
            assert read == dataset.targets[list(samplers[0])].tolist()
        layout = dataset.shard_of_sample() if hasattr(dataset, "shard_of_sample") else None
        if layout is not None:
            sampler = ShardedSampler(dataset, 1, 0)
            assert len(sampler.starts) == len(set(layout.tolist())) > 1
