"""packer.Mixture: per-source counts by the largest-remainder rule, per-source permutation streams
(small sources repeat in fresh orders, large ones are covered before anything repeats), an order
that is a pure function of (seed, epoch), DataLoader workers under fork and spawn, ShardedSampler
over two ranks, a StatefulDataLoader resume, labels per source or in one qualified index, and clear
errors for bad weights.

Real packed datasets: the conftest LMDB (12 images, 3 classes) and a small NPY one (6 images,
2 classes) made with the demo generator; their class names collide on purpose.
"""

from __future__ import annotations

import math
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

import packer
from packer.demo.image import make_image_tree

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata


class Keyed:
    """A packer dataset whose items are ``("tag:key", label)``: each sample really read, and
    named so that two sources with the same keys stay apart."""

    def __init__(self, dataset: Any, tag: str) -> None:
        self.dataset, self.tag = dataset, tag
        self.classes = dataset.classes
        self.shard_of_sample = dataset.shard_of_sample

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[str, int]:
        _, label = self.dataset[i]  # really read it
        return f"{self.tag}:{self.dataset.keys[i]}", label


@pytest.fixture(scope="module")
def big(packed: dict[str, Path]) -> Any:
    return packer.open_dataset(packed[".lmdb"], output="bytes")


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("mix")
    tree = make_image_tree(root / "extra", classes=2, per_class=3, size=(64, 48), bad=0, seed=5)
    packer.convert(tree.root, root / "extra.npy", shard_size="8kB", workers=1, progress=False)
    return packer.open_dataset(root / "extra.npy", output="bytes")


@pytest.fixture(scope="module")
def keyed(big: Any, small: Any) -> dict[str, Keyed]:
    return {"a": Keyed(big, "a"), "b": Keyed(small, "b")}


def expected(mixture: packer.Mixture) -> list[str]:
    """The epoch's items by the mixture's own layout, as "tag:key"."""
    source, index = mixture.layout()
    return [
        f"{mixture.names[s]}:{mixture.sources[mixture.names[s]].dataset.keys[j]}"
        for s, j in zip(source.tolist(), index.tolist())
    ]


def test_the_fixtures_are_what_the_numbers_below_assume(big: Any, small: Any) -> None:
    assert (len(big), len(small)) == (12, 6)
    assert set(small.classes) <= set(big.classes)  # colliding class names


@pytest.mark.parametrize(
    ("weights", "epoch_size", "counts"),
    [
        (None, None, {"a": 12, "b": 6}),  # default: sizes, the sources' total
        ({"a": 1, "b": 1}, None, {"a": 9, "b": 9}),
        ({"a": 1, "b": 1}, 7, {"a": 4, "b": 3}),  # 3.5 / 3.5: the tie goes to the first
        ({"a": 1, "b": 2}, 10, {"a": 3, "b": 7}),  # 3.33 / 6.67: the larger remainder
        ({"a": 0.1, "b": 0.2}, 10, {"a": 3, "b": 7}),  # floats, exact fractions
        ({"a": 0, "b": 1}, 5, {"a": 0, "b": 5}),  # a weight of 0: unused
        ({"a": 5, "b": 1, "c": 1}, 20, {"a": 14, "b": 3, "c": 3}),  # 14.29 2.86 2.86
    ],
)
def test_per_source_counts_follow_the_largest_remainder_rule(
    keyed: dict[str, Keyed], weights: Any, epoch_size: Any, counts: dict[str, int]
) -> None:
    sources = {**keyed, "c": keyed["a"]} if "c" in counts else keyed
    mixture = packer.Mixture(sources, weights=weights, epoch_size=epoch_size, seed=4)
    assert mixture.counts == counts
    assert len(mixture) == sum(counts.values())
    for epoch in (0, 3):
        mixture.set_epoch(epoch)
        got = Counter(mixture.source_of(i) for i in range(len(mixture)))
        assert got == Counter({k: v for k, v in counts.items() if v})


def stream(mixture: packer.Mixture, name: str, epochs: int) -> np.ndarray:
    return np.concatenate([mixture.draws(name, e) for e in range(epochs)])


def test_small_repeats_in_fresh_orders_large_is_covered_before_repeats(
    keyed: dict[str, Keyed],
) -> None:
    """a (12) takes 5 per epoch: a subset; b (6) takes 15 per epoch: 2.5 passes."""
    mixture = packer.Mixture(keyed, weights={"a": 1, "b": 3}, epoch_size=20, seed=7, block=2)
    assert mixture.counts == {"a": 5, "b": 15}
    for name, n in (("a", 12), ("b", 6)):
        drawn = stream(mixture, name, 12)
        for p in range(len(drawn) // n):  # every pass of the stream is each sample once
            assert sorted(drawn[p * n : (p + 1) * n].tolist()) == list(range(n))
    subsets = [frozenset(mixture.draws("a", e).tolist()) for e in range(3)]
    assert len(set(subsets)) == 3 and frozenset().union(*subsets) == frozenset(range(12))
    thrice, orders = set(), set()
    for epoch in range(6):
        mixture.set_epoch(epoch)
        per = Counter(key for key, _ in (mixture[i] for i in range(20)) if key.startswith("b:"))
        assert sorted(per.values()) == [2, 2, 2, 3, 3, 3]  # 15 = 2.5 passes of 6
        thrice.add(frozenset(k for k, c in per.items() if c == 3))
        source, index = mixture.layout()
        orders.add(tuple(index[source == 1].tolist()))
    assert len(thrice) > 2 and len(orders) == 6  # fresh passes, fresh orders


def test_the_order_is_a_pure_function_of_seed_and_epoch(keyed: dict[str, Keyed]) -> None:
    """Default weights: every source once per epoch, so only the order can change by epoch."""
    one = packer.Mixture(keyed, seed=2, block=3)
    two = pickle.loads(pickle.dumps(packer.Mixture(keyed, seed=2, block=3)))
    for epoch in (0, 1, 5):
        one.set_epoch(epoch)
        two.set_epoch(epoch)
        assert [one[i] for i in range(len(one))] == [two[i] for i in range(len(two))]
    orders = {tuple(np.concatenate(one.layout(e)).tolist()) for e in range(4)}
    assert len(orders) == 4
    other = packer.Mixture(keyed, seed=3, block=3)
    assert not np.array_equal(np.stack(other.layout(0)), np.stack(one.layout(0)))


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_dataloader_workers_read_the_rules_multiset(keyed: dict[str, Keyed], context: str) -> None:
    mixture = packer.Mixture(keyed, weights={"a": 1, "b": 2}, epoch_size=16, seed=1, block=2)
    mixture.set_epoch(2)
    loader = DataLoader(
        mixture, batch_size=3, num_workers=2, multiprocessing_context=context, collate_fn=list
    )
    got = [key for batch in loader for key, _ in batch]
    assert Counter(got) == Counter(expected(mixture))
    assert Counter(key[0] for key in got) == {"a": 5, "b": 11}


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_persistent_workers_follow_set_epoch(keyed: dict[str, Keyed], context: str) -> None:
    mixture = packer.Mixture(keyed, weights={"a": 1, "b": 2}, epoch_size=16, seed=1, block=2)
    loader = DataLoader(
        mixture,
        batch_size=3,
        num_workers=2,
        multiprocessing_context=context,
        collate_fn=list,
        persistent_workers=True,
    )
    for epoch in (0, 1, 2):
        mixture.set_epoch(epoch)
        got = Counter(key for batch in loader for key, _ in batch)
        assert got == Counter(expected(mixture)), epoch


def test_sharded_sampler_over_two_ranks_gives_exactly_the_epoch(keyed: dict[str, Keyed]) -> None:
    mixture = packer.Mixture(keyed, weights={"a": 2, "b": 1}, epoch_size=22, seed=1, block=3)
    chunks = mixture.shard_of_sample()
    for epoch in (0, 1):
        mixture.set_epoch(epoch)
        source, index = mixture.layout()
        for c in np.unique(chunks):  # a chunk is one source's consecutive (sorted) draws
            assert len(set(source[chunks == c].tolist())) == 1
        got: list[int] = []
        for rank in (0, 1):
            sampler = packer.ShardedSampler(mixture, num_replicas=2, rank=rank, seed=5)
            sampler.set_epoch(epoch)
            got += list(sampler)
        assert sorted(got) == list(range(22))
    assert np.array_equal(sampler.starts, np.flatnonzero(np.diff(chunks, prepend=-1)))


def test_labels_per_source_or_in_one_qualified_index(big: Any, small: Any) -> None:
    own = packer.Mixture({"a": big, "b": small}, seed=0)
    assert own.classes == {"a": big.classes, "b": small.classes}
    for i in range(len(own)):
        name, j = own.locate(i)
        assert own[i][1] == own.sources[name][j][1]
    one = packer.Mixture({"a": big, "b": small}, seed=0, label_offset=True)
    assert one.classes == [f"a/{c}" for c in big.classes] + [f"b/{c}" for c in small.classes]
    assert len(set(one.classes)) == len(big.classes) + len(small.classes)  # no collision
    for i in range(len(one)):
        name, j = one.locate(i)
        sample, label = one[i]
        own_sample, own_label = one.sources[name][j]
        assert sample == own_sample
        assert one.classes[label] == f"{name}/{one.sources[name].classes[own_label]}"
    batch = [5, 0, 17, 3, 3, -1]  # one batch read per source, in the order asked
    assert one.__getitems__(batch) == [one[i] for i in batch]
    assert own.__getitems__(batch) == [own[i] for i in batch]
    with pytest.raises(IndexError, match="index 18 out of range for a mixture of 18"):
        own.__getitems__([0, 18])


@pytest.mark.parametrize(
    ("weights", "epoch_size", "message"),
    [
        ({"a": -1, "b": 1}, None, "weight of source 'a' is -1"),
        ({"a": math.nan, "b": 1}, None, "weight of source 'a' is nan"),
        ({"a": math.inf, "b": 1}, None, "finite number >= 0"),
        ({"a": 0, "b": 0}, None, "every weight is 0"),
        ({"a": 1, "c": 1}, None, "unknown sources ['c'] and leave out ['b']"),
        ({"a": 1}, None, "leave out ['b']"),
        ({"a": "1", "b": 1}, None, "must be a number"),
        ([1, 2], None, "must map source names"),
        (None, 0, "epoch_size must be at least 1"),
    ],
)
def test_bad_weights_are_clear_errors(
    keyed: dict[str, Keyed], weights: Any, epoch_size: Any, message: str
) -> None:
    with pytest.raises(packer.PackerError, match=message.replace("[", r"\[").replace("]", r"\]")):
        packer.Mixture(keyed, weights=weights, epoch_size=epoch_size)


def test_unknown_source_and_bad_epoch_are_clear_errors(keyed: dict[str, Keyed]) -> None:
    mixture = packer.Mixture(keyed)
    with pytest.raises(
        packer.PackerError, match=r"no source named 'c'; the sources are \['a', 'b'\]"
    ):
        mixture.draws("c", 0)
    with pytest.raises(
        packer.PackerError, match=r"epoch must be an integer from 0 to 2\*\*31 - 1, not -1"
    ):
        mixture.set_epoch(-1)
    with pytest.raises(packer.PackerError, match="non-empty"):
        packer.Mixture({})


@pytest.mark.parametrize("persistent", [False, True])
def test_a_stateful_dataloader_checkpoint_resumes_the_exact_order(
    keyed: dict[str, Keyed], persistent: bool
) -> None:
    """Epoch 0 whole, then a checkpoint 4 batches into epoch 1: the resumed loader (a new
    process group of workers) continues epoch 1 in exactly the uninterrupted run's order."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> tuple[packer.Mixture, packer.ShardedSampler, Any]:
        mixture = packer.Mixture(keyed, weights={"a": 1, "b": 1}, epoch_size=20, seed=9, block=2)
        sampler = packer.ShardedSampler(mixture, num_replicas=1, rank=0, seed=9)
        return (
            mixture,
            sampler,
            StatefulDataLoader(
                mixture,
                batch_size=2,
                sampler=sampler,
                num_workers=2,
                multiprocessing_context="fork",
                collate_fn=list,
                persistent_workers=persistent,
            ),
        )

    def epoch(parts: tuple[Any, ...], e: int, stop: int | None = None) -> list[str]:
        mixture, sampler, run = parts
        mixture.set_epoch(e)
        sampler.set_epoch(e)
        seen: list[str] = []
        for step, batch in enumerate(run):
            seen += [key for key, _ in batch]
            if step == stop:
                break
        return seen

    whole = loader()
    first, second = epoch(whole, 0), epoch(whole, 1)
    broken = loader()
    assert epoch(broken, 0) == first
    before = epoch(broken, 1, stop=3)
    state = broken[2].state_dict()  # nothing computed by hand
    del broken
    resumed = loader()
    resumed[2].load_state_dict(state)
    after = epoch(resumed, 1)  # the epoch is the caller's to set, as on every epoch
    assert len(before) == 8 and before + after == second
    assert Counter(second) == Counter(expected(whole[0])) and first != second


def test_images_and_clips_mix_and_set_epoch_reaches_the_clips(big: Any, tmp_path: Path) -> None:
    from packer.demo.video import make_video_tree
    from packer.write.convert import convert_video

    tree = make_video_tree(tmp_path / "frames", classes=2, per_class=2, seed=3)
    convert_video(tree.root, tmp_path / "clips.lmdb", workers=1, progress=False)
    clips = packer.open_video_dataset(tmp_path / "clips.lmdb", num_frames=4, output="numpy")
    mixture = packer.Mixture({"img": big, "clip": clips}, label_offset=True)
    assert mixture.counts == {"img": 12, "clip": 4}
    mixture.set_epoch(3)
    assert clips.epoch == 3
    clips.set_epoch(0)  # as a persistent worker's copy would still have it
    mixture[[mixture.source_of(i) for i in range(len(mixture))].index("clip")]
    assert clips.epoch == 3  # a read brings the source to the mixture's epoch
    shapes = {}
    for i in range(len(mixture)):
        sample, label = mixture[i]
        name = mixture.source_of(i)
        shapes[name] = getattr(sample, "shape", None)
        assert mixture.classes[label].startswith(f"{name}/")
    assert shapes["clip"] is not None and shapes["clip"][0] == 4  # a clip of 4 frames
    assert shapes["img"] is None  # the image source's own output (bytes)


def test_indices_cover_minus_len_to_len_and_no_further(keyed: dict[str, Keyed]) -> None:
    """The length is computed once (review); indexing still accepts exactly ``-n .. n-1``, one
    by one and batched, and a negative index is the same item as ``i + n``."""
    mixture = packer.Mixture(keyed, weights={"a": 2, "b": 1}, epoch_size=13, seed=2, block=3)
    n = len(mixture)
    assert n == 13 == sum(mixture.counts.values())
    forward = [mixture[i][0] for i in range(n)]
    assert forward == expected(mixture)
    assert [mixture[i - n][0] for i in range(n)] == forward
    assert [key for key, _ in mixture.__getitems__(list(range(-n, n)))] == forward + forward
    for outside in (n, -n - 1):
        with pytest.raises(IndexError, match=f"index {outside} out of range for a mixture of 13"):
            mixture[outside]
        with pytest.raises(IndexError, match=f"index {outside} out of range"):
            mixture.__getitems__([0, outside])
    assert len(pickle.loads(pickle.dumps(mixture))) == n  # what a spawned worker gets


def test_the_sampler_moves_the_mixtures_epoch_also_on_resume(keyed: dict[str, Keyed]) -> None:
    """Frameworks call only the sampler's set_epoch (Lightning) and a StatefulDataLoader only its
    load_state_dict: both reach the mixture, whose draws then are the epoch's."""
    mixture = packer.Mixture(keyed, weights={"a": 1, "b": 1}, epoch_size=10, seed=3)
    sampler = packer.ShardedSampler(mixture, num_replicas=1, rank=0, seed=3)
    sampler.set_epoch(4)
    assert mixture.epoch == 4
    state = sampler.state_dict(consumed=3)
    fresh = packer.Mixture(keyed, weights={"a": 1, "b": 1}, epoch_size=10, seed=3)
    resumed = packer.ShardedSampler(fresh, num_replicas=1, rank=0, seed=3)
    resumed.load_state_dict(state)
    assert fresh.epoch == 4
    assert [fresh[i][0] for i in list(resumed)] == [mixture[i][0] for i in list(sampler)[3:]]
    assert fresh.draws("a", 4).tolist() != fresh.draws("a", 0).tolist()  # the epoch matters


def test_a_sampler_state_is_refused_by_a_mixture_built_otherwise(keyed: dict[str, Keyed]) -> None:
    """Issue 28, 12: a state saved over Mixture(seed=1) loaded silently into Mixture(seed=2) (the
    sampler's own fingerprint is the same: same length and chunks), and the resumed epoch read
    some samples twice and missed others. The mixture's seed, shares and sources are in the
    state: another one is refused, naming what differs; the same one resumes exactly."""
    built = {"weights": {"a": 1, "b": 1}, "epoch_size": 10, "block": 3}

    def sampler(**changed: Any) -> tuple[packer.Mixture, packer.ShardedSampler]:
        args = {"seed": 1, **built, **changed}
        sources = args.pop("sources", keyed)
        mixture = packer.Mixture(sources, **args)
        return mixture, packer.ShardedSampler(mixture, num_replicas=1, rank=0, seed=7)

    mixture, saved = sampler()
    saved.set_epoch(2)
    state = saved.state_dict(consumed=4)
    for changed, what in (
        ({"seed": 2}, "mixture_seed"),
        ({"weights": {"a": 1, "b": 4}}, "mixture_shares"),
        ({"sources": {"a": keyed["b"], "b": keyed["a"]}}, "mixture_sources"),
    ):
        other, resumed = sampler(**changed)
        assert len(other) == len(mixture)
        assert other.shard_of_sample().tolist() == mixture.shard_of_sample().tolist()
        with pytest.raises(packer.PackerError, match=f"saved with {what}=.*resuming would"):
            resumed.load_state_dict(state)
    same, resumed = sampler()
    resumed.load_state_dict(state)
    before = [mixture[i][0] for i in list(saved)[:4]]
    after = [same[i][0] for i in list(resumed)]
    assert Counter(before + after) == Counter(expected(mixture))  # exactly one epoch
    older = {k: v for k, v in state.items() if not k.startswith("mixture_")}
    with pytest.raises(packer.PackerError, match="has no mixture_seed"):
        sampler()[1].load_state_dict(older)  # a state that cannot say which mixture it was
    same, resumed = sampler()
    resumed.load_state_dict({**resumed.state_dict(), **older})  # the way the refusal gives
    assert [same[i][0] for i in list(resumed)] == after


@pytest.mark.parametrize("epoch", [-1, 2**31, 10**30])
def test_negative_and_absurd_epochs_are_refused(keyed: dict[str, Keyed], epoch: int) -> None:
    mixture = packer.Mixture(keyed, seed=1)
    sampler = packer.ShardedSampler(mixture, num_replicas=1, rank=0)
    state = sampler.state_dict(consumed=0)
    for call in (
        lambda: sampler.set_epoch(epoch),
        lambda: sampler.load_state_dict({**state, "epoch": epoch}),
        lambda: mixture.set_epoch(epoch),
        lambda: mixture.draws("a", epoch),
    ):
        with pytest.raises(packer.PackerError, match=r"epoch must be .*0 .*2\*\*31"):
            call()
    assert (sampler.epoch, mixture.epoch) == (0, 0)  # nothing changed
    sampler.set_epoch(2**31 - 1)
    assert mixture.epoch == 2**31 - 1 and len(list(sampler)) == len(mixture)
