"""The sample keys of a packed output, read lazily from ``keys.txt`` without a ``str`` per key.

``keys.txt`` holds one key per line (backslash, line feed and carriage return escaped as
``\\\\``, ``\\n``, ``\\r``, so any name keeps its line). :class:`KeyTable` memory-maps it on
first use and finds the line starts with numpy (4 or 8 bytes per key, in this process only);
a key is decoded when asked for. A million keys open in milliseconds, take no Python object
each, and share the file's pages with forked DataLoader workers (mapped, clean, never copied).
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from packer.core.contained import Identity, fstat_identity, open_beneath, open_folder, replaced
from packer.errors import FormatError

__all__ = ["KeyTable", "escape_key", "unescape_key"]

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\r": "\\r"}
_UNESCAPES = {"\\": "\\", "n": "\n", "r": "\r"}
# A component that is empty, "." or "..", anywhere in a line (a leading "/" makes an empty one).
_NOT_PLAIN = re.compile(rb"(?:\A|([\n/]))(?:\.\.?)?(?=[\n/]|\Z)")


def escape_key(key: str) -> str:
    """A key as one line of ``keys.txt``."""
    if "\\" not in key and "\n" not in key and "\r" not in key:
        return key
    return "".join(_ESCAPES.get(c, c) for c in key)


def unescape_key(line: str) -> str:
    """The key one line of ``keys.txt`` holds."""
    if "\\" not in line:
        return line
    out, chars = [], iter(line)
    for c in chars:
        out.append(_UNESCAPES.get(next(chars, ""), "\\") if c == "\\" else c)
    return "".join(out)


def _line_starts(blob: np.ndarray, block: int = 1 << 18) -> np.ndarray:
    """Where each line of ``blob`` starts, plus where the one after the last would: ``uint32``
    (``int64`` past 4 GiB), found a block at a time so the only big allocation is the result."""
    lines = sum(
        int(np.count_nonzero(blob[a : a + block] == 10)) for a in range(0, len(blob), block)
    )
    starts = np.zeros(lines + 1, dtype=np.uint32 if len(blob) < 2**32 else np.int64)
    n = 1
    for a in range(0, len(blob), block):
        ends = np.flatnonzero(blob[a : a + block] == 10)
        starts[n : n + len(ends)] = ends + (a + 1)
        n += len(ends)
    return starts


class KeyTable(Sequence[str]):
    """The keys of ``path`` (a ``keys.txt``), mapped on first use, decoded on access.

    Args:
        path: the keys file.
        count: the number of keys the file must hold (the manifest's), checked on first use.
        plain: keys name files (a ``per-sample`` layout): every key must be a plain relative
            path, checked on first use for the whole file at once.
        pinned: ``((st_dev, st_ino) of the dataset folder, identity of the file)`` seen when
            the dataset was opened: a process that maps the file again refuses any other.

    A dataset's table is made by :meth:`loaded` from the bytes checked at open. Pickling keeps
    only the arguments; each process maps the file again when it first reads, through the
    dataset folder's descriptor, and refuses a folder or file replaced since the open.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        count: int | None = None,
        plain: bool = False,
        pinned: tuple[tuple[int, int] | None, Identity] | None = None,
    ) -> None:
        self.path = Path(path)
        self.expected = count
        self.plain = plain
        self.pinned = pinned
        self._blob: np.ndarray | None = None
        self._starts: np.ndarray | None = None  # n + 1 line starts; key i ends at starts[i+1]-1

    @classmethod
    def loaded(
        cls,
        path: Path,
        data: object,
        count: int | None,
        plain: bool,
        pinned: tuple[tuple[int, int] | None, Identity],
    ) -> KeyTable:
        """The table over ``data``, the file's bytes already read and checked (a map)."""
        table = cls(path, count, plain, pinned)
        table._blob = np.frombuffer(data, np.uint8) if len(data) else np.zeros(0, np.uint8)  # type: ignore[arg-type, call-overload]
        return table

    def _map(self) -> np.ndarray:
        folder_id, ident = self.pinned if self.pinned is not None else (None, None)
        folder = open_folder(self.path.parent, folder_id)
        try:
            fd = open_beneath(folder, self.path.name, self.path.parent)
        finally:
            os.close(folder)
        try:
            if ident is not None and fstat_identity(fd) != tuple(ident):
                raise replaced(self.path)
            size = os.fstat(fd).st_size
            return (
                np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), np.uint8)
                if size
                else np.zeros(0, np.uint8)
            )
        except (OSError, ValueError) as exc:
            raise FormatError(f"cannot read {str(self.path)!r}: {exc}") from exc
        finally:
            os.close(fd)

    def _load(self) -> tuple[np.ndarray, np.ndarray]:
        if self._blob is not None and self._starts is not None:
            return self._blob, self._starts
        blob = self._blob if self._blob is not None else self._map()
        starts = _line_starts(blob)
        if self.expected is not None and len(starts) - 1 != self.expected:
            raise FormatError(
                f"{str(self.path)!r} holds {len(starts) - 1} keys but the manifest says "
                f"{self.expected} samples: the dataset is corrupt, convert again"
            )
        if self.plain:
            self._check_plain(blob, int(starts[-1]))
        self._blob, self._starts = blob, starts
        return blob, starts

    def _check_plain(self, blob: np.ndarray, end: int) -> None:
        """Every key names a file inside the dataset folder: no absolute key, no empty, ``.``
        or ``..`` component, no NUL byte (escapes never make a ``/``, ``.`` or NUL)."""
        data = blob[:end].tobytes()[:-1]  # the last line's end is the end of the data
        found = _NOT_PLAIN.search(data) if end else None
        nul = data.find(b"\0")
        if found is not None and (nul < 0 or found.start() < nul):
            # the component starts after the separator matched; a line feed starts a new key
            n = data.count(b"\n", 0, found.start()) + (found.group(1) == b"\n")
        elif nul >= 0:
            n = data.count(b"\n", 0, nul)
        else:
            return
        raise FormatError(
            f"{str(self.path.parent)!r}: key {n} ({self._line(blob, n)!r}) is not a plain relative "
            "name; refusing to read outside the dataset folder"
        )

    def __len__(self) -> int:
        return len(self._load()[1]) - 1

    def _key(self, i: int) -> str:
        blob, starts = self._load()
        return self._decode(blob[int(starts[i]) : int(starts[i + 1]) - 1])

    @staticmethod
    def _line(blob: np.ndarray, n: int) -> str:
        """Key ``n`` while the file is being checked (before the table is ready)."""
        data = blob.tobytes()
        return unescape_key(data.split(b"\n")[n].decode("utf-8", "surrogateescape"))

    @staticmethod
    def _decode(line: np.ndarray) -> str:
        return unescape_key(line.tobytes().decode("utf-8", "surrogateescape"))

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        n = len(self)
        if isinstance(i, slice):
            return [self._key(j) for j in range(*i.indices(n))]
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for {n} strings")
        return self._key(int(i) % n)

    def __iter__(self) -> Iterator[str]:
        return (self._key(i) for i in range(len(self)))

    def __repr__(self) -> str:
        n = len(self)
        head = ", ".join(repr(self._key(i)) for i in range(min(3, n)))
        return f"KeyTable([{head}{', ...' if n > 3 else ''}], {n} strings)"

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "count": self.expected,
            "plain": self.plain,
            "pinned": self.pinned,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["count"], state["plain"], state.get("pinned"))  # type: ignore[misc]
