"""What every dataset shares, images and clips alike: classes and targets, index checks,
transforms, decoding errors and ``repr``. Holds only picklable state; a dataset over a packed
output pickles small (:class:`PackedSamples`: its arguments and what it opened, never its
tables), whatever its number of samples."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from torch.utils.data import Dataset

from packer.core.keytable import KeyTable
from packer.core.manifest import Manifest
from packer.decode.outputs import check_output
from packer.decode.registry import check_decoder
from packer.errors import FormatError, InputFileError, PackerError
from packer.formats.base import ReaderBase
from packer.read.reopen import changed, mark, still_there
from packer.read.scatter import OrderWatch
from packer.read.spill import load, spill
from packer.read.store import Packed
from packer.remote.storage import is_url

# The run of consecutive samples a dataset read from a URL by ranged GETs (no cache) asks
# ShardedSampler to keep together: a batch of 64 then holds 4-5 runs, each one GET (side by side
# in its shard), instead of ~45 scattered records.
RANGED_RUN = 16

__all__ = ["PackedSamples", "SampleDataset", "Transform"]

Transform = Callable[[Any], Any] | None


class SampleDataset(Dataset):
    """The base of every packer dataset.

    Args:
        root: the dataset's folder.
        classes: class names; a sample's label indexes them.
        labels: one label per sample.
        transform: applied to each item (an image, or a whole clip).
        target_transform: applied to each label.
        output: ``"pil"``, ``"numpy"``, ``"tensor"`` or ``"bytes"``.
        on_error: ``"raise"`` (default) an :class:`InputFileError` for a sample that cannot be
            decoded, or ``"skip"``: serve the next decodable sample in its place (the same one
            every time) and count it in ``replaced``, so one bad sample of a dataset packed
            elsewhere cannot kill an epoch.
        decoder: ``"auto"`` (the fastest installed, Pillow last), ``"pillow"``,
            ``"simplejpeg"``, ``"turbojpeg"`` or ``"opencv"`` (see :mod:`packer.decode.registry`);
            checked here, so a missing library fails at construction, not in a worker.
    """

    UNIT = "samples"

    def __init__(
        self,
        root: str | os.PathLike[str],
        classes: list[str],
        labels: np.ndarray,
        transform: Transform = None,
        target_transform: Transform = None,
        output: str = "pil",
        on_error: str = "raise",
        decoder: str = "auto",
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise PackerError(f"unknown on_error {on_error!r}; expected 'raise' or 'skip'")
        self.on_error = on_error
        self.replaced = 0  # samples served in place of an undecodable one, in this process
        self.root = Path(root)
        self.classes = list(classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.targets = np.ascontiguousarray(labels, dtype=np.int64)
        self.transform = transform
        self.target_transform = target_transform
        self.output = check_output(output)
        self.decoder = check_decoder(decoder)

    def __len__(self) -> int:
        return len(self.targets)

    def close(self) -> None:
        """Release the files and maps this process holds open for the dataset (none for a plain
        folder). The dataset stays usable: a later read opens what it needs again."""

    def __enter__(self) -> SampleDataset:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _or_replacement(
        self, i: int, make: Callable[[int], Any], first: Callable[[], Any] | None = None
    ) -> Any:
        """``make(i)`` (or ``first()``, the same from data already read); when it raises
        :class:`InputFileError` and ``on_error="skip"``, ``make(j)`` for the first decodable
        sample after ``i`` (the same one every time), counted in ``replaced``."""
        try:
            return first() if first is not None else make(i)
        except InputFileError:
            if self.on_error != "skip":
                raise
        for step in range(1, min(len(self), 17)):
            j = (i + step) % len(self)
            try:
                item = make(j)
            except InputFileError:
                continue
            self.replaced += 1
            return item
        raise InputFileError(f"{self._describe(i)} and the 16 samples after it cannot be decoded")

    def _position(self, i: Any) -> int:
        n = len(self.targets)
        if not isinstance(i, (int, np.integer)) or isinstance(i, bool):
            raise TypeError(f"dataset indices must be integers, not {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} {self.UNIT}")
        position = int(i) % n
        self._watch_order((position,))
        return position

    def _watch_order(self, positions: Sequence[int] | np.ndarray) -> None:
        """Note the order samples are read in (a packed dataset at a URL warns if scattered)."""

    def _positions(self, indices: Sequence[int]) -> list[int]:
        return self._position_array(indices).tolist()

    def _position_array(self, indices: Sequence[int]) -> np.ndarray:
        """The positions of a batch of indices (negative ones count from the end), as int64."""
        n = len(self.targets)
        idx = np.asarray(indices)
        if idx.ndim != 1:
            raise TypeError("a batch of indices must be a flat sequence of integers")
        if not len(idx):
            return np.zeros(0, dtype=np.int64)
        if idx.dtype.kind not in "iu":  # each one checked (and watched) by _position
            return np.array([self._position(i) for i in indices], dtype=np.int64)  # or raises
        low, high = idx.min(), idx.max()
        if low < -n or high >= n:
            bad = next(int(i) for i in idx if not -n <= i < n)
            raise IndexError(f"index {bad} out of range for a dataset of {n} {self.UNIT}")
        idx = idx.astype(np.int64, copy=False)
        positions = idx % n if low < 0 else idx
        self._watch_order(positions)
        return positions

    def _describe(self, i: int) -> str:
        return f"sample {i}"

    def _label(self, i: int) -> Any:
        label: Any = int(self.targets[i])
        if self.target_transform is not None:
            label = self.target_transform(label)
        return label

    def _repr_fields(self) -> str:
        return f"classes={len(self.classes)}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.root)!r}, {self.UNIT}={len(self)}, "
            f"{self._repr_fields()}, output={self.output!r}"
            + (f", decoder={self.decoder!r})" if self.decoder != "auto" else ")")
        )


class PackedSamples:
    """What a dataset over a packer output adds: its manifest, reader and keys.

    Pickled (a DataLoader worker under spawn or forkserver, a Mixture's sources), it keeps
    only its options and the arguments it was opened with (the root made absolute) and the
    identity of what it opened: the manifest's digest (which holds every table's xxh3), the
    folder, ``keys.txt`` and each shard. The process that unpickles it opens the output again
    itself on first use (maps the tables, checks them against the manifest) and refuses, with
    a :class:`~packer.errors.FormatError` raised by that use (a DataLoader hands it to the
    training process), an output whose identity differs: what a worker serves is what the
    parent opened. So its pickle is a few KB at any number of samples. An attribute
    of :data:`REOPENED` the caller replaced (or a ``targets`` changed in place) is pickled as
    it is. A dataset at a URL (or staged through the shard cache) fetched its tables: its
    opened state is pickled small by :mod:`packer.read.spill` (its arrays in one node-local
    file, mapped and checked by the process that unpickles it, which fetches nothing again);
    where that file is missing (another machine), that process opens the URL again on first
    use, as a local dataset is opened again, and refuses a manifest whose digest differs from
    the one the parent opened.
    """

    root: Path
    UNIT: str
    manifest: Manifest
    reader: ReaderBase
    first: np.ndarray
    counts: np.ndarray

    # what the open of the output makes, made again by the process that unpickles the dataset
    REOPENED = ("manifest", "reader", "first", "counts", "targets", "frame_counts", "checksums")

    def _attach(self, packed: Packed) -> None:
        self.root = packed.root  # a split's own folder when a split was opened
        self.manifest = packed.manifest
        self.reader = packed.reader
        self.first = packed.first
        self.counts = packed.counts

    def _opened_by(self, owner: type, args: dict[str, Any]) -> None:
        """Remember how this dataset was opened: ``owner.__init__(self, **args)``, the last
        step of that ``__init__`` (see the class docstring)."""
        if not self._remote():  # a URL stays as it was given
            args = {**args, "root": Path(args["root"]).absolute()}  # a worker may run elsewhere
        marks = {n: mark(self.__dict__[n]) for n in self.REOPENED if n in self.__dict__}
        self.__dict__["_reopen"] = (owner, args, marks)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if "_pending" in state:  # unpickled, never read: as it came
            state["_reopen"] = state.pop("_pending")
            return state
        remembered = state.pop("_reopen", None)
        if remembered is None:
            return state
        owner, args, marks = remembered
        opened = {}
        for name, made in marks.items():
            if name in state and mark(state[name]) == made:
                opened[name] = state.pop(name)  # made again where it is unpickled
        state["_reopen"] = (owner, args, self._identity())
        if opened and self._remote():  # fetched: its arrays mapped from a node-local file
            spilled = spill(opened)
            if spilled is None:  # the file cannot be written here: pickled whole
                del state["_reopen"]
                state.update(opened)
            else:
                state["_spilled"] = spilled
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state = dict(state)
        remembered = state.pop("_reopen", None)
        spilled = state.pop("_spilled", None)
        self.__dict__.update(state)
        opened = None if spilled is None else load(spilled)
        if opened is not None and remembered is not None:  # what the parent opened, mapped
            self.__dict__.update(opened)
            marks = {name: mark(value) for name, value in opened.items()}
            self.__dict__["_reopen"] = (remembered[0], remembered[1], marks)
        elif remembered is not None:  # opened again on first use (a refusal is then a read's)
            self.__dict__["_pending"] = remembered

    def __getattr__(self, name: str) -> Any:
        pending = self.__dict__.get("_pending")
        if pending is None or name not in self.REOPENED:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        kept = dict(self.__dict__)
        del kept["_pending"], self.__dict__["_pending"]
        owner, args, identity = pending
        try:
            if identity["path"] is not None:  # a local output: the folder, keys.txt it opened
                still_there(identity)
            owner.__init__(self, **args)
            found = self._identity()
            if found != identity:
                raise FormatError(changed(kept.get("root", args["root"]), identity, found))
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(kept, _pending=pending)  # refused again at the next use
            raise
        self.__dict__.update(kept)
        return getattr(self, name)

    def _identity(self) -> dict[str, Any]:
        """What this dataset opened: its manifest's digest (every table's xxh3 is in it), the
        folder's and every shard's identity (a local output)."""
        text = json.dumps(self.manifest.to_dict(), sort_keys=True, ensure_ascii=True)
        digest = xxhash.xxh3_64_hexdigest(text.encode("ascii"))
        if self._remote():  # its tables' xxh3 are in the manifest; its shards are checked
            return {"manifest": digest, "folder": (), "shards": None, "keys": None, "path": None}
        shards, keys = self.reader.shard_ids, self.reader.keys.pinned
        return {
            "manifest": digest,
            "folder": tuple(self.reader.root_id or ()),
            "shards": None if shards is None else [tuple(s) for s in shards],
            "keys": None if keys is None else tuple(keys[1]),
            "path": os.path.abspath(self.reader.root),
        }

    def _remote(self) -> bool:
        """Whether this dataset was opened at a URL (or staged through the shard cache)."""
        return is_url(str(self.root)) or str(self.root).startswith("file:")

    def _watch_order(self, positions: Sequence[int] | np.ndarray) -> None:
        if not self.reader.RANGED:  # a local dataset, or one read through the cache
            return
        watch = self.__dict__.get("_order_watch")
        if watch is None:
            watch = self.__dict__["_order_watch"] = OrderWatch(str(self.root))
        watch.see(np.asarray(positions, dtype=np.int64))

    def close(self) -> None:
        """Close this process's shard and per-sample file handles, maps and LMDB environments
        (they reopen on the next read). The tables (``index.npy``, ``records.npy``,
        ``keys.txt``) stay mapped while the dataset object lives: they are its index."""
        self.reader.close()

    def stored_bytes(self, indices: Sequence[int]) -> int:
        """Bytes the samples' records occupy (every frame of a video, read or not)."""
        length = self.reader.length
        return sum(
            int(length[self.first[i] : self.first[i] + self.counts[i]].sum()) for i in indices
        )

    def shard_of_sample(self) -> np.ndarray | None:
        """Each sample's shard number (the file of its first record), in sample order, or
        ``None`` when every sample has its own file (the ``per-sample`` layout).

        A conversion writes samples in order, so a shard holds a run of consecutive samples:
        the blocks :class:`packer.ShardedSampler` reads together by default.
        """
        if self.reader.layout != "shards":
            return None
        return self.reader.file[self.first]

    @property
    def preferred_run(self) -> int:
        """The run of consecutive samples :class:`packer.ShardedSampler` keeps together by
        default: :data:`RANGED_RUN` for a dataset of shards at a URL read without the cache (a
        run's records side by side in a shard: one ranged GET), else 1."""
        ranged = self.reader.RANGED and self.reader.layout == "shards"
        return RANGED_RUN if ranged else 1

    @property
    def prefetches(self) -> bool:
        """Whether :meth:`prefetch` can fetch anything: a remote dataset of shards read through
        the node-local cache (downloads), or a local one whose reader reads whole shards (the
        kernel asked to read them into the page cache)."""
        return bool(self.reader.prefetches)

    def prefetch(self, samples: Sequence[int] | np.ndarray) -> int:
        """Start fetching the shards that hold ``samples`` in the background: into the
        node-local shard cache (a remote dataset), or into the page cache (a local one); see
        :attr:`prefetches`, elsewhere nothing to do. How many shards were asked for.
        :class:`packer.ShardedSampler` calls it ahead of reading."""
        if not self.prefetches:
            return 0
        chosen = np.asarray(samples, dtype=np.int64)
        first = self.first[chosen]
        last = first + np.maximum(self.counts[chosen], 1) - 1
        files = self.reader.file[np.concatenate((first, last))].tolist()
        return int(self.reader.prefetch(files))

    @property
    def keys(self) -> KeyTable:
        """Each sample's key: its source path relative to the root, without suffix (read
        lazily from ``keys.txt``: no ``str`` per sample until asked)."""
        return self.reader.keys

    def _describe(self, i: int) -> str:
        return f"{self.UNIT[:-1]} {i} ({self.keys[i]!r} in {str(self.root)!r})"
