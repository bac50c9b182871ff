"""A weighted mixture of named datasets: one map-style dataset whose epochs take each source at a
stated share, reproducibly, so that it resumes and re-shards like a single packed dataset.

**Epoch length.** ``epoch_size``, or by default the sources' total (``sum(len(s))``).

**Per-source counts.** Each epoch takes ``count[s]`` samples of source ``s``: its weight over the
weights' sum times the epoch length, rounded by the *largest remainder* rule (every share rounded
down, then one more each to the sources with the largest fractional parts, ties to the source
given first), computed in exact fractions, so the counts sum to the epoch length exactly.
Weights default to the sources' sizes (an epoch of the default length then reads every source
exactly once). A weight of 0 leaves a source out; a negative, NaN or infinite weight, all zeros,
a missing or an unknown source name are :class:`PackerError`.

**Which samples.** Source ``s`` (``n`` samples) is read as an endless *stream*: its draw ``k`` is
element ``k mod n`` of a permutation of ``0 .. n-1`` seeded by ``(seed, s, k // n)`` (``s``: the
source's name and place), a fresh one per pass. Epoch ``e`` takes draws ``e*count[s] .. (e+1)*count[s] - 1``. So a source smaller than
its share repeats, each pass in a fresh permutation (every sample ``count // n`` or one more times
per epoch); a larger one gets a different subset each epoch and every sample is seen once before
any is seen twice. Everything is a pure function of ``(seed, epoch, position)``.

**Order within an epoch (locality).** An epoch's draws of each pass are sorted (so they walk the
source's shards in order) and cut into *chunks* of ``block`` consecutive draws of one source. The
epoch's order is the full chunks of every source shuffled by ``(seed, epoch)``, then each
source's last, shorter chunk, in source order. ``shard_of_sample()`` names these chunks (their
boundaries are the same every epoch), so ``ShardedSampler(mixture)`` shuffles chunks and the
samples inside them and keeps every source's reads local. The order never depends on the rank,
the number of ranks or workers. ``block`` defaults to the sources' median samples per shard (256
when no source is sharded). Read in its own order, a mixture gives runs of ``block`` samples of
one source: use ``ShardedSampler`` (``mix=k`` mixes ``k`` chunks) or a shuffling sampler.

**Labels.** By default an item is the source's own ``(sample, label)`` and ``classes`` is a dict
``{source: its classes}``. ``label_offset=True`` maps labels into one index by concatenating the
sources' classes in the given order (source ``s``'s label plus the number of classes before it);
``classes`` is then one list of qualified ``"source/class"`` names, so two sources' ``"cat"``
are ``"a/cat"`` and ``"b/cat"`` with distinct indices, never silently merged.

**Epochs.** Epochs run from 0 to 2**31 - 1. ``mixture.set_epoch(e)`` before each epoch (it also reaches sources with a
``set_epoch``, such as clip datasets). A ``ShardedSampler(mixture)`` does it for you: its
``set_epoch`` and its ``load_state_dict`` (a resume, e.g. by a ``StatefulDataLoader``) pass the
epoch on, so frameworks that only call the sampler's ``set_epoch`` (Lightning, accelerate) move
the mixture too; with another sampler, call it yourself, also after resuming. The epoch lives in
a one-number shared-memory tensor that DataLoader workers share under fork and spawn, so
``persistent_workers=True`` workers follow it too.

**Resuming.** A ``ShardedSampler(mixture)`` state holds the mixture's seed, per-epoch counts
(what the weights and ``epoch_size`` make), the sources' names and sizes, and its block
(:meth:`Mixture.state_fingerprint`): loading it into a sampler over a mixture built otherwise is
a :class:`PackerError`, never an epoch that repeats some samples and misses others. A dataset
that wraps a mixture passes ``state_fingerprint`` on as it passes ``shard_of_sample``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from packer.errors import PackerError

__all__ = ["Mixture", "largest_remainder"]

DEFAULT_BLOCK = 256  # draws per chunk when no source says how it is sharded
MAX_EPOCH = 2**31 - 1  # as ShardedSampler's: a larger epoch is a corrupt state or a bug


def _epoch(value: Any) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or not (0 <= value <= MAX_EPOCH)
    ):
        raise PackerError(f"epoch must be an integer from 0 to 2**31 - 1, not {value!r}")
    return int(value)


def _integer(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PackerError(f"{name} must be an integer, not {value!r}")
    if value < minimum:
        raise PackerError(f"{name} must be at least {minimum}, not {value}")
    return int(value)


def largest_remainder(weights: Sequence[Fraction], total: int) -> list[int]:
    """``total`` split in proportion to ``weights``: each share rounded down, then one more to
    the shares with the largest fractional parts (ties: the first) until they sum to ``total``."""
    whole = sum(weights, Fraction(0))
    quotas = [w * total / whole for w in weights]
    counts = [math.floor(q) for q in quotas]
    rest = total - sum(counts)
    by_remainder = sorted(range(len(quotas)), key=lambda s: (-(quotas[s] - counts[s]), s))
    for s in by_remainder[:rest]:
        counts[s] += 1
    return counts


def _weight(name: str, value: Any) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise PackerError(f"the weight of source {name!r} must be a number, not {value!r}")
    if not math.isfinite(value) or value < 0:
        raise PackerError(
            f"the weight of source {name!r} is {value!r}; a weight must be a finite number >= 0 "
            "(0 leaves the source out)"
        )
    return Fraction(int(value)) if isinstance(value, (int, np.integer)) else Fraction(float(value))


def _weights(names: list[str], sizes: list[int], weights: Any) -> list[Fraction]:
    if weights is None:
        if not any(sizes):
            raise PackerError(f"every source is empty ({dict(zip(names, sizes))}): nothing to mix")
        return [Fraction(n) for n in sizes]
    if not isinstance(weights, Mapping):
        raise PackerError(f"weights must map source names to numbers, not {weights!r:.100}")
    unknown = sorted(set(map(str, weights)) - set(names))
    missing = [n for n in names if n not in weights]
    if unknown or missing:
        raise PackerError(
            f"weights name unknown sources {unknown} and leave out {missing}; the sources are "
            f"{names}: give each of them a weight (0 leaves one out)"
        )
    found = [_weight(n, weights[n]) for n in names]
    if not any(found):
        raise PackerError(f"every weight is 0 ({dict(weights)}): give one source a weight > 0")
    return found


def _check_fields(sources: dict[Any, Any]) -> None:
    """Refuse a mixture of samples with fields unless every source reads the same fields."""
    read = {str(n): getattr(ds, "fields", None) for n, ds in sources.items()}
    if any(f is not None for f in read.values()) and len({str(f) for f in read.values()}) > 1:
        shown = "; ".join(
            f"{n!r} reads {f if f is not None else 'no fields'}" for n, f in read.items()
        )
        raise PackerError(
            f"a Mixture of samples with fields needs the same fields in every source: {shown} "
            "(open each with the same fields=)"
        )


def _median_shard(source: Any) -> int | None:
    shards = getattr(source, "shard_of_sample", None)
    layout = shards() if callable(shards) else None
    if layout is None or len(layout) == 0:
        return None
    layout = np.asarray(layout)
    starts = np.concatenate(([0], np.flatnonzero(layout[1:] != layout[:-1]) + 1, [len(layout)]))
    return max(1, int(np.median(np.diff(starts))))


class Mixture:
    """A map-style dataset over named sources at stated shares (rules: see the module docstring).

    Args:
        sources: ``{name: dataset}``, any sized datasets whose items are ``(sample, label)``
            (packer image or clip datasets, local or remote); their order is the mixture's.
        weights: ``{name: weight}`` for every source; ``None``: the sources' sizes.
        epoch_size: samples per epoch; ``None``: the sources' total.
        seed: the seed of the draws and of the order, the same on every rank.
        label_offset: one class index over all sources (qualified ``"source/class"`` names)
            instead of each source's own labels.
        block: draws per chunk (the blocks ``ShardedSampler`` keeps together); ``None``: the
            sources' median samples per shard, else 256.

    Raises:
        PackerError: no sources, a bad weight (negative, NaN, all zero, unknown or missing
            name), a positive share of an empty source, or a bad ``epoch_size``/``block``.

    Example::

        mixture = packer.Mixture({"imagenet": ds_a, "extra": ds_b}, weights={"imagenet": 0.8,
                                 "extra": 0.2}, seed=1)
        sampler = packer.ShardedSampler(mixture, seed=1)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)  # also the mixture's
            for sample, label in DataLoader(mixture, batch_size=64, sampler=sampler): ...
    """

    def __init__(
        self,
        sources: Mapping[str, Any],
        weights: Mapping[str, float] | None = None,
        epoch_size: int | None = None,
        seed: int = 0,
        label_offset: bool = False,
        block: int | None = None,
    ) -> None:
        if not isinstance(sources, Mapping) or not sources:
            raise PackerError(
                f"sources must be a non-empty {{name: dataset}} dict, not {sources!r:.100}"
            )
        self.sources = dict(sources)
        self.names = [str(name) for name in self.sources]
        _check_fields(self.sources)
        sizes = [len(ds) for ds in self.sources.values()]
        self.sizes = dict(zip(self.names, sizes))
        self.seed = _integer("seed", seed, 0)
        length = sum(sizes) if epoch_size is None else _integer("epoch_size", epoch_size, 1)
        shares = largest_remainder(_weights(self.names, sizes, weights), length)
        self.counts = dict(zip(self.names, shares))
        self._length = sum(shares)  # every index check needs it: computed once
        empty = [n for n in self.names if self.counts[n] and not self.sizes[n]]
        if empty:
            raise PackerError(f"sources {empty} are empty but their weights give them samples")
        if block is None:
            found = [b for b in map(_median_shard, self.sources.values()) if b is not None]
            block = int(np.median(found)) if found else DEFAULT_BLOCK
        self.block = _integer("block", block, 1)
        self.label_offset = bool(label_offset)
        self.classes, self.offsets = self._classes()
        # shared with DataLoader workers (fork and spawn), so persistent workers see set_epoch
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None

    def _classes(self) -> tuple[Any, dict[str, int]]:
        own = {n: list(getattr(ds, "classes", None) or []) for n, ds in self.sources.items()}
        if not self.label_offset:
            return own, dict.fromkeys(self.names, 0)
        missing = [n for n in self.names if not own[n] and self.counts[n]]
        if missing:
            raise PackerError(
                f"label_offset=True needs each source's classes; sources {missing} have none"
            )
        offsets: dict[str, int] = {}
        qualified: list[str] = []
        for name in self.names:
            offsets[name] = len(qualified)
            qualified += [f"{name}/{c}" for c in own[name]]
        return qualified, offsets

    def __len__(self) -> int:
        return self._length

    @property
    def epoch(self) -> int:
        """The current epoch (0 until ``set_epoch``)."""
        return int(self._epoch)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s draws and order, here and in DataLoader workers (also
        persistent ones); passed on to sources with a ``set_epoch``."""
        self._epoch.fill_(_epoch(epoch))
        for ds in self.sources.values():
            if callable(getattr(ds, "set_epoch", None)):
                ds.set_epoch(epoch)

    def draws(self, name: str, epoch: int) -> np.ndarray:
        """The indices of source ``name`` that epoch ``epoch`` reads, sorted within each pass."""
        if name not in self.sizes:
            raise PackerError(f"no source named {name!r}; the sources are {self.names}")
        epoch = _epoch(epoch)
        s, n, count = self.names.index(name), self.sizes[name], self.counts[name]
        tag = zlib.crc32(name.encode())
        first, end = epoch * count, (epoch + 1) * count
        parts = []
        for p in range(first // n, -(-end // n)) if count else ():
            perm = np.random.default_rng([self.seed, tag, s, p]).permutation(n)
            parts.append(np.sort(perm[max(first, p * n) - p * n : min(end, (p + 1) * n) - p * n]))
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def _chunks(self) -> tuple[int, list[int]]:
        """How many full chunks (``count // block`` per source) and each source's last, shorter
        chunk's size (where it has one), in source order."""
        full = sum(c // self.block for c in self.counts.values())
        return full, [c % self.block for c in self.counts.values() if c % self.block]

    def layout(self, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Epoch ``epoch``'s (default: the current one) order: each position's source number
        (in ``names``) and its index in that source."""
        epoch = self.epoch if epoch is None else _epoch(epoch)
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1], self._cache[2]
        b = self.block
        full_src, full_idx, tail_src, tail_idx = [], [], [], []
        for s, name in enumerate(self.names):
            drawn = self.draws(name, epoch)
            cut = len(drawn) // b * b
            full_idx.append(drawn[:cut].reshape(-1, b))
            full_src.append(np.full(cut // b, s, np.int64))
            tail_idx.append(drawn[cut:])
            tail_src.append(np.full(len(drawn) - cut, s, np.int64))
        rows = np.concatenate(full_idx)
        owner = np.concatenate(full_src)
        shuffle = np.random.default_rng([self.seed, epoch, 0x6D6978]).permutation(len(rows))
        source = np.concatenate([np.repeat(owner[shuffle], b), *tail_src])
        index = np.concatenate([rows[shuffle].reshape(-1), *tail_idx])
        self._cache = (epoch, source, index)
        return source, index

    def state_fingerprint(self) -> dict[str, int]:
        """What the mixture's order depends on besides its length and chunks, which
        :class:`packer.ShardedSampler` puts in its state so that a state saved over another
        mixture (another seed, shares or sources) is refused instead of repeating and skipping
        samples: the seed, and checksums of the per-epoch counts and of the sources' names and
        sizes, in their order."""
        shares = ",".join(f"{n}={self.counts[n]}" for n in self.names)
        sources = ",".join(f"{n}={self.sizes[n]}" for n in self.names)
        return {
            "mixture_seed": self.seed,
            "mixture_shares": zlib.crc32(shares.encode()),
            "mixture_sources": zlib.crc32(sources.encode()),
            "mixture_block": self.block,
        }

    def shard_of_sample(self) -> np.ndarray:
        """Each position's chunk number: the same boundaries every epoch (see the module
        docstring), the blocks :class:`packer.ShardedSampler` keeps together."""
        full, tails = self._chunks()
        sizes = [self.block] * full + tails
        return np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)

    def _position(self, i: Any) -> int:
        n = self._length
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"mixture indices must be integers, not {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for a mixture of {n} samples per epoch")
        return int(i) % n

    def locate(self, i: int) -> tuple[str, int]:
        """``(source name, index in that source)`` of position ``i`` in the current epoch."""
        source, index = self.layout()
        position = self._position(i)
        return self.names[int(source[position])], int(index[position])

    def source_of(self, i: int) -> str:
        """The name of the source position ``i`` of the current epoch reads."""
        return self.locate(i)[0]

    def __getitem__(self, i: int) -> Any:
        name, j = self.locate(i)
        return self._relabel(name, j, self._source(name)[j])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        """A batch, read with one ``__getitems__`` per source where the source has one (a
        packer dataset then reads each shard once), in the order asked."""
        source, index = self.layout()
        positions = np.asarray(indices)
        n = self._length
        if (
            positions.ndim != 1
            or positions.dtype.kind not in "iu"
            or not (len(positions) == 0 or (-n <= positions.min() and positions.max() < n))
        ):
            positions = np.array([self._position(i) for i in indices], dtype=np.int64)
        positions = positions.astype(np.int64) % max(n, 1)
        out: list[Any] = [None] * len(positions)
        for s, name in enumerate(self.names):
            mine = np.flatnonzero(source[positions] == s).tolist()
            if not mine:
                continue
            ds, wanted = self._source(name), index[positions[mine]].tolist()
            many = getattr(ds, "__getitems__", None)
            items = many(wanted) if callable(many) else [ds[j] for j in wanted]
            for k, j, item in zip(mine, wanted, items):
                out[k] = self._relabel(name, j, item)
        return out

    def _source(self, name: str) -> Any:
        """Source ``name``, at the mixture's epoch if it has one (a persistent worker's copy of a
        clip dataset follows the shared epoch here)."""
        ds = self.sources[name]
        if callable(getattr(ds, "set_epoch", None)) and getattr(ds, "epoch", None) != self.epoch:
            ds.set_epoch(self.epoch)
        return ds

    def _relabel(self, name: str, j: int, item: Any) -> Any:
        if not self.label_offset:
            return item
        sample, label = item
        if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
            raise PackerError(
                f"label_offset=True needs integer labels; source {name!r} gave {label!r} for "
                f"sample {j} (a target_transform?)"
            )
        return sample, int(label) + self.offsets[name]

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = None  # recomputed in each process from (seed, epoch)
        return state

    def __repr__(self) -> str:
        shares = ", ".join(f"{n}={self.counts[n]}/{self.sizes[n]}" for n in self.names)
        return f"Mixture({shares}, epoch={self.epoch}, seed={self.seed}, block={self.block})"
