"""A compact, picklable table of strings: one uint8 blob plus int64 offsets.

DataLoader workers touch Python objects' refcounts when reading them, which copies the pages of
a forked parent's lists of strings into every worker (pytorch#13246). Two numpy arrays do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["StringTable"]


class StringTable:
    """An immutable sequence of strings stored in two numpy arrays."""

    def __init__(self, items: Iterable[str]) -> None:
        encoded = [s.encode("utf-8", "surrogateescape") for s in items]
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in encoded], out=self._offsets[1:])
        self._blob = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"index {i} out of range for {len(self)} strings")
        i %= len(self)
        start, stop = self._offsets[i], self._offsets[i + 1]
        return self._blob[start:stop].tobytes().decode("utf-8", "surrogateescape")

    def __iter__(self) -> Iterator[str]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        head = ", ".join(repr(self[i]) for i in range(min(3, len(self))))
        return f"StringTable([{head}{', ...' if len(self) > 3 else ''}], {len(self)} strings)"
