"""A DDP sampler that reads shard by shard and resumes mid-epoch, also on another number of ranks.

Every packer dataset also works with ``torch.utils.data.DistributedSampler`` (it only needs
``len``). :class:`ShardedSampler` adds two things a large packed dataset on a disk or NFS wants.

**Shard-local reads.** A conversion writes samples in order, so a shard holds a run of
consecutive samples. An epoch's *global order* shuffles *blocks* of consecutive samples (by
default a dataset's shards, from ``dataset.shard_of_sample()``; otherwise ``block`` samples,
256 when not given), then the samples inside each block. At any moment every rank reads from the
same one block (or ``mix`` blocks), so the page cache and the disk's readahead serve a small
region instead of the whole dataset. ``shuffle=False`` is the plain order ``0 .. n-1``. The order
is a pure function of ``(len(dataset), blocks, seed, epoch, mix, run)``: never of the rank or the
number of ranks. A caveat: samples are converted in class order, so a block of one shard is
mostly one class; ``mix=k`` shuffles the samples of ``k`` consecutive shuffled blocks together
(``k`` open regions at a time instead of one), which gives batches of ``k`` shards' classes.

**Splitting across ranks.** The rest of the epoch's global order from ``start`` (0, or a resume
point) is dealt out round robin: rank ``r`` of ``R`` gets positions ``start + r``,
``start + r + R``, ... Every rank gets the same count: without ``drop_last`` the sequence is
padded by repeating its beginning (as ``DistributedSampler`` does); with ``drop_last`` its tail of
fewer than ``R`` samples is left out. So when every rank has consumed ``k`` samples, what the
whole job has consumed is exactly the *prefix* ``start .. start + k*R`` of the global order,
whatever ``R`` is.

**Resuming.** That prefix is the state: ``state_dict(consumed=k)`` records ``epoch`` and the
global position ``start + k*R`` (the number of samples of the epoch's order consumed; the whole
epoch once ``k`` reaches the rank's count), plus what the order depends on so that loading it
into a sampler built differently fails loudly instead of repeating or skipping samples. Any
number of ranks can load it: their iteration deals out the *remaining* samples of the same global
order, so the samples before and after the restart make exactly one epoch (apart from padding).
Pass ``consumed`` from the training loop (e.g. ``(step + 1) * batch_size``): a DataLoader takes
indices from the sampler ahead of the loop (``prefetch_factor`` batches per worker), so what the
sampler has handed out (the default) overcounts unless ``num_workers=0``. torchdata's
``StatefulDataLoader`` needs no count: it takes the sampler's ``state_dict()`` as it sends each
batch's indices to a worker and gives back the one of the last batch the loop received
(``tests/test_stateful.py``). The state is the same on every rank (save it from rank 0); it
holds ints and bools only (~110 pickled bytes, ~200 over a Mixture, whatever the
dataset's size). A dataset whose order has inputs of its own (a :class:`packer.Mixture`: its
seed, shares and sources) adds them through a ``state_fingerprint()``; a state saved over
another one is refused. Epochs run from 0 to ``MAX_EPOCH`` (2**31 - 1): a state with another
epoch is refused as corrupt.

The resume point serves the iterations of its epoch until one runs to its end; ``set_epoch``
with another epoch starts that epoch from its beginning. A dataset with a ``set_epoch`` of its
own (a :class:`packer.Mixture`, whose draws change each epoch; a clip dataset) follows the
sampler: ``set_epoch`` and ``load_state_dict`` pass the epoch on, so a framework that only calls
the sampler's ``set_epoch`` (PyTorch Lightning, accelerate) and a resume from a checkpoint move
the dataset to the right epoch too. ``len(sampler)`` is always a whole epoch's count on this
rank (as torch's and torchdata's samplers do), so a framework that counts an epoch's batches
from ``len(loader)`` and restores how many were done (PyTorch Lightning) ends the resumed epoch
where it ends.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import Sampler

from packer.errors import PackerError

__all__ = ["DEFAULT_BLOCK", "ShardedSampler", "block_starts", "epoch_order", "rank_indices"]

DEFAULT_BLOCK = 256  # samples per block when the dataset does not say how it is sharded
STATE_VERSION = 1
MAX_EPOCH = 2**31 - 1  # a larger epoch is a corrupt state or a bug, not a schedule
_POSITION = ("version", "epoch", "consumed")  # a state's keys that are not its order's inputs
_IMPLIED = {"run": 1}  # order inputs a state records only when they differ from this


def epoch_number(value: Any) -> int:
    """``value`` as an epoch: an integer from 0 to ``MAX_EPOCH``, else a PackerError."""
    epoch = _integer("epoch", value)
    if not 0 <= epoch <= MAX_EPOCH:
        raise PackerError(f"epoch must be an integer from 0 to 2**31 - 1, not {epoch}")
    return epoch


def _integer(name: str, value: Any, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PackerError(f"{name} must be an integer, not {value!r}")
    if minimum is not None and value < minimum:
        raise PackerError(f"{name} must be at least {minimum}, not {value}")
    return int(value)


def block_starts(n: int, block: int | None = None, shards: np.ndarray | None = None) -> np.ndarray:
    """Where each block of consecutive samples starts: every ``block`` samples, or where the
    shard number changes in ``shards`` (one per sample) when ``block`` is ``None``."""
    if block is None and shards is not None:
        shards = np.asarray(shards)
        if len(shards) != n:
            raise PackerError(f"shards holds {len(shards)} entries for {n} samples")
        change = np.flatnonzero(shards[1:] != shards[:-1]) + 1
        return np.concatenate(([0], change)).astype(np.int64) if n else np.zeros(0, np.int64)
    return np.arange(0, n, block or DEFAULT_BLOCK, dtype=np.int64)


def epoch_order(
    n: int,
    starts: np.ndarray,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    mix: int = 1,
    run: int = 1,
) -> np.ndarray:
    """The epoch's global order of the samples ``0 .. n-1``: blocks (``starts``) shuffled, then
    the samples within each group of ``mix`` consecutive shuffled blocks; with ``run > 1``, the
    runs of ``run`` consecutive samples of each block are shuffled instead, each run's samples
    kept together in their order."""
    if not shuffle or n == 0:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng([seed % 2**64, epoch % 2**64])
    sizes = np.diff(np.append(starts, n))
    block_of = np.repeat(np.arange(len(starts)), sizes)
    group = rng.permutation(len(starts)) // mix  # a block's group in the shuffled block order
    if run == 1:
        return np.lexsort((rng.random(n), group[block_of])).astype(np.int64)
    runs = -(-sizes // run)  # runs per block, the last one short
    first_run = np.concatenate(([0], np.cumsum(runs)[:-1]))
    run_of = first_run[block_of] + (np.arange(n) - starts[block_of]) // run
    run_key = rng.random(int(runs.sum()))[run_of]
    # a run's samples in their order: one cut by a batch's end leaves two spans, not scatter
    return np.lexsort((np.arange(n), run_key, group[block_of])).astype(np.int64)


def per_rank(remaining: int, num_replicas: int, drop_last: bool) -> int:
    """Samples each rank gets out of ``remaining``."""
    if drop_last:
        return remaining // num_replicas
    return -(-remaining // num_replicas)


def rank_indices(
    order: np.ndarray, start: int, num_replicas: int, rank: int, drop_last: bool
) -> np.ndarray:
    """Rank ``rank``'s share of ``order[start:]``, dealt round robin, padded by repeating the
    beginning (or with the tail dropped) so that every rank gets the same count."""
    rest = order[start:]
    total = per_rank(len(rest), num_replicas, drop_last) * num_replicas
    if total > len(rest):
        rest = np.concatenate((rest, np.resize(rest, total - len(rest))))
    return rest[:total][rank::num_replicas]


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    initialized = dist.is_available() and dist.is_initialized()
    if num_replicas is None:
        num_replicas = dist.get_world_size() if initialized else 1
    num_replicas = _integer("num_replicas", num_replicas, 1)
    if rank is None:
        if not initialized and num_replicas > 1:
            raise PackerError(
                f"rank= is required with num_replicas={num_replicas} when torch.distributed is "
                "not initialized (every process would otherwise read rank 0's samples)"
            )
        rank = dist.get_rank() if initialized else 0
    rank = _integer("rank", rank, 0)
    if rank >= num_replicas:
        raise PackerError(f"rank {rank} is out of range for num_replicas={num_replicas}")
    return num_replicas, rank


class ShardedSampler(Sampler[int]):
    """Shuffles blocks of consecutive samples (a dataset's shards by default), splits them across
    DDP ranks, and resumes mid-epoch on any number of ranks (see the module docstring).

    Args:
        dataset: any sized dataset; a packer dataset's ``shard_of_sample()`` gives the blocks.
        num_replicas: ranks sharing the epoch; the ``torch.distributed`` world size by default,
            1 without a process group.
        rank: this process's rank; the ``torch.distributed`` rank by default, 0 without one.
        shuffle: shuffle blocks and samples each epoch; ``False`` reads ``0 .. n-1`` in order.
        seed: the shuffle's seed, the same on every rank.
        drop_last: leave out the epoch's last samples that do not split evenly across the ranks
            instead of padding with repeated ones.
        block: samples per block; ``None``: the dataset's shards, else 256.
        mix: blocks whose samples are shuffled together (more classes per batch when shards
            hold one class each, ``mix`` regions read at a time).
        prefetch: blocks fetched ahead of the one being read, for a dataset with a
            ``prefetch(samples)``: a remote dataset read through the node-local shard cache
            has their shards downloaded on background threads while the current block is
            read, a local one has the kernel read their shard files into the page cache
            (where its reader reads whole shards); 0 turns it off.
        run: shuffle each block's runs of ``run`` consecutive samples (each run in its order)
            instead of its single samples, so a batch holds whole runs: a dataset at a URL read
            without the cache then fetches a run's records in one ranged GET.
            ``None``: the dataset's ``preferred_run`` (16 for such a dataset, else 1: every
            sample shuffled on its own). A run of ``k`` gives each of ``R``
            ranks about ``k / R`` consecutive samples.

    Raises:
        PackerError: an argument of the wrong type or out of range.

    Example::

        sampler = ShardedSampler(dataset, seed=1)
        loader = DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=8)
        for epoch in range(start_epoch, epochs):
            sampler.set_epoch(epoch)
            for step, batch in enumerate(loader):
                ...
                state = sampler.state_dict(consumed=(step + 1) * 64)  # saved with the model
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        block: int | None = None,
        mix: int = 1,
        prefetch: int = 2,
        run: int | None = None,
    ) -> None:
        self.num_replicas, self.rank = _world(num_replicas, rank)
        self.seed = _integer("seed", seed)
        self.mix = _integer("mix", mix, 1)
        self.block = None if block is None else _integer("block", block, 1)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.n = len(dataset)
        shards = getattr(dataset, "shard_of_sample", None)
        layout = shards() if callable(shards) and self.block is None else None
        self.starts = block_starts(self.n, self.block, layout)
        self.prefetch = _integer("prefetch", prefetch, 0)
        if run is None:  # the dataset's own preference: a URL read by ranged GETs asks for runs
            preferred = getattr(dataset, "preferred_run", 1)
            run = preferred if isinstance(preferred, int) else 1
        self.run = _integer("run", run, 1)
        fetch = (
            getattr(dataset, "prefetch", None) if getattr(dataset, "prefetches", False) else None
        )
        self._fetch = fetch if callable(fetch) and self.prefetch else None  # else no look-ahead
        # the blocks' checksum, in every state_dict: hashed once (a 1M-sample index has ~1000s)
        self._blocks_crc = zlib.crc32(self.starts.tobytes()) if self.shuffle else 0
        # what the dataset's own order depends on (a Mixture's seed, shares and sources)
        own = getattr(dataset, "state_fingerprint", None)
        self._dataset_fingerprint: dict[str, int] = dict(own()) if callable(own) else {}
        self.epoch = 0
        follow = getattr(dataset, "set_epoch", None)  # a Mixture's draws follow our epoch
        self._dataset_set_epoch = follow if callable(follow) else None
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its global order)
        self._at(0)

    def _at(self, start: int) -> None:
        self._start = start  # where this epoch's next iteration starts in the global order
        self._yielded = 0  # indices handed out by the current (or last) iteration
        self._done = False  # the last iteration from _start ran to its end

    def order(self) -> np.ndarray:
        """The current epoch's global order (the same on every rank)."""
        if self._order is None or self._order[0] != self.epoch:
            order = epoch_order(
                self.n, self.starts, self.seed, self.epoch, self.shuffle, self.mix, self.run
            )
            self._order = (self.epoch, order)
        return self._order[1]

    def set_epoch(self, epoch: int) -> None:
        """Use the order of ``epoch``; another epoch than the current one starts at its
        beginning, the current one keeps a resume point. Passed on to a dataset with a
        ``set_epoch`` (a :class:`packer.Mixture`, a clip dataset)."""
        epoch = epoch_number(epoch)
        if epoch != self.epoch:
            self.epoch = epoch
            self._at(0)
        self._pass_epoch_on()

    def _pass_epoch_on(self) -> None:
        if self._dataset_set_epoch is not None:
            self._dataset_set_epoch(self.epoch)

    def __len__(self) -> int:
        """Samples of a whole epoch on this rank, also after a resume (an iteration resumed
        mid-epoch yields only the rest). Frameworks count an epoch's batches from it and restore
        how many were done: PyTorch Lightning ends a resumed epoch at its restored batch count
        plus what is left, which a length of the rest alone would cut short."""
        return per_rank(self.n, self.num_replicas, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        if self._done:  # the resumed part of the epoch was read: the next pass is a whole one
            self._at(0)
        indices = rank_indices(
            self.order(), self._start, self.num_replicas, self.rank, self.drop_last
        )
        self._yielded = 0
        ahead = self._ahead(indices) if self._fetch is not None else {}
        for k, i in enumerate(indices.tolist()):
            if k in ahead:
                self._fetch(ahead[k])  # type: ignore[misc]
            self._yielded += 1
            yield i
        self._done = True

    def _ahead(self, indices: np.ndarray) -> dict[int, np.ndarray]:
        """Where to ask the dataset to fetch what: at the first sample of each block (in the
        order blocks first appear here), a sample of the block ``prefetch`` blocks later; at
        the start, one of each of the first ``prefetch + 1``."""
        if not len(indices):
            return {}
        blocks = np.searchsorted(self.starts, indices, side="right") - 1
        _, first = np.unique(blocks, return_index=True)
        first = np.sort(first)  # where each block first appears, in reading order
        heads = indices[first]
        ahead = {
            int(k): heads[j + self.prefetch : j + self.prefetch + 1] for j, k in enumerate(first)
        }
        ahead[0] = heads[: self.prefetch + 1]
        return {k: v for k, v in ahead.items() if len(v)}

    def _fingerprint(self) -> dict[str, Any]:
        return {
            "num_samples": self.n,
            "shuffle": self.shuffle,
            "seed": self.seed if self.shuffle else 0,
            "mix": self.mix if self.shuffle else 1,
            "blocks": self._blocks_crc,
            # recorded only where it changes the order (states saved before it existed load)
            **({"run": self.run} if self.shuffle and self.run != 1 else {}),
            **self._dataset_fingerprint,
        }

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the epoch is: ``{"epoch", "consumed", ...}``, the same on every rank.

        Args:
            consumed: samples this rank's loop has taken since the current iteration began (the
                sum of the batch sizes received: the last batch may be short). ``None``: the indices the sampler has handed out,
                which is ahead of the loop when DataLoader workers prefetch.

        Raises:
            PackerError: ``consumed`` is negative or more than the iteration holds.
        """
        count = per_rank(self.n - self._start, self.num_replicas, self.drop_last)
        k = self._yielded if consumed is None else _integer("consumed", consumed, 0)
        if k > count:
            raise PackerError(
                f"consumed={k} is more than the {count} samples this rank's iteration holds"
            )
        position = self.n if k == count else self._start + k * self.num_replicas
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "consumed": position,
            **self._fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the saved epoch from the first sample no rank had consumed.

        Raises:
            PackerError: the state is not a ShardedSampler's, was saved by a sampler with
                another order (dataset length, seed, shuffle, blocks or mix) or over a dataset
                with another order of its own (a Mixture's seed, shares, sources), or its epoch
                is negative or past ``MAX_EPOCH``.
        """
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise PackerError(
                f"not a ShardedSampler state of version {STATE_VERSION}: {state!r:.200}"
            )
        fingerprint = self._fingerprint()
        extra = [k for k in state if k not in fingerprint and k not in _POSITION]
        for key in [*fingerprint, *extra]:  # and what only the state records: its order too
            ours = fingerprint.get(key, _IMPLIED.get(key))
            if key not in state:
                raise PackerError(
                    f"the sampler state has no {key} (this sampler has {key}={ours!r}): it was "
                    "saved over another dataset, or by an older packer that did not record it, "
                    "so resuming could repeat and skip samples. If it was saved over this very "
                    "dataset (same seed, weights and sources), load "
                    "{**sampler.state_dict(), **state} to take this sampler's values for what "
                    "it lacks; otherwise start the epoch afresh"
                )
            if state.get(key) != ours:
                raise PackerError(
                    f"the sampler state was saved with {key}={state.get(key)!r}, this sampler "
                    f"has {key}={ours!r}: resuming would repeat and skip samples. Build the "
                    "sampler as it was built when the state was saved"
                )
        epoch = epoch_number(state.get("epoch"))
        position = _integer("consumed", state.get("consumed"), 0)
        if position > self.n:
            raise PackerError(f"consumed={position} is past the epoch's {self.n} samples")
        self.epoch = epoch
        self._at(position)
        self._pass_epoch_on()
