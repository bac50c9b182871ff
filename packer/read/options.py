"""How a dataset is read, beyond what it returns: the options every dataset class and
``open_dataset`` take by name, and the one check of the keywords a user passes.

A typo in a keyword (``readahed=True``) is a :class:`~packer.errors.PackerError` naming the
keyword, the closest known one and every known one, raised before anything is opened, instead
of a ``TypeError`` from a reader three calls down.
"""

from __future__ import annotations

import difflib
import inspect
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from packer.errors import PackerError

__all__ = ["READ_OPTIONS", "ReadOptions", "check_keywords", "keywords_of", "old_name"]


@dataclass(frozen=True)
class ReadOptions:
    """The read options (each ``None`` keeps packer's default).

    Attributes:
        split: the split to open (``"train"``, ``"val"``, ...) of an output holding splits.
        readahead: ``True`` reads ahead (a mapped shard's whole file put in flight at its
            first touch; LMDB's readahead), ``False`` reads only what is asked; ``None``
            decides by the dataset's size against the memory available (LMDB: on for images).
        max_open_files: how many data files a process keeps open at once (per-sample layouts).
        storage_options: for a URL, the fsspec options (endpoint, credentials, ...).
        cache: for a URL, read NPY/HDF5 shards through the node's shard cache (LMDB always is).
        cache_dir: for a URL, the shard cache's folder (default ``$PACKER_CACHE_DIR``, else
            ``~/.cache/packer``).
        cache_limit: for a URL, the shard cache's size bound (bytes or ``"50GB"``).
        check_records: check every record read from a local dataset against its xxh3 in the
            record table (``packer.formats.record_check``): a record that differs (a flipped
            byte in a shard) is refused with a :class:`~packer.errors.FormatError` naming the
            sample and its file instead of served. Off by default (one xxh3 per record read:
            see ``docs/reading.md`` for the measured cost); a URL's records (ranged or through
            the shard cache) are always checked.
    """

    split: str | None = None
    readahead: bool | None = None
    max_open_files: int | None = None
    storage_options: dict[str, Any] | None = None
    cache: bool | None = None
    cache_dir: str | os.PathLike[str] | None = None
    cache_limit: int | str | None = None
    check_records: bool = False

    @classmethod
    def of(
        cls, options: ReadOptions | None, split: str | None, given: dict[str, Any]
    ) -> ReadOptions:
        """One object from ``options`` and the read options given by name (``split`` too),
        each name checked.

        Raises:
            PackerError: an unknown name, an option given both ways, or two splits.
        """
        check_keywords(given, [n for n in READ_OPTIONS if n != "split"], "open_packed")
        if split is not None:
            given = {**given, "split": split}
        given = {n: v for n, v in given.items() if v != _DEFAULTS[n]}
        if options is None:
            return cls(**given)
        both = [n for n in given if getattr(options, n) != _DEFAULTS[n]]
        if both and any(given[n] != getattr(options, n) for n in both):
            raise PackerError(f"{both[0]} is given twice (by name and in options=), differently")
        return replace(options, **given)

    def for_reader(self) -> dict[str, Any]:
        """The options given that the format's reader takes (``readahead``,
        ``max_open_files``), by name."""
        names = ("readahead", "max_open_files")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def given(self) -> dict[str, Any]:
        """The options given (not their default: ``None``, ``check_records=False``), as
        ``open_packed``'s keyword arguments."""
        return {k: v for k, v in asdict(self).items() if v != _DEFAULTS[k]}

    def remote_only(self) -> list[str]:
        """The options given that apply to a URL only."""
        local = ("split", "readahead", "max_open_files", "check_records")
        return [k for k in self.given() if k not in local]


READ_OPTIONS = tuple(f.name for f in fields(ReadOptions))
_DEFAULTS = {f.name: f.default for f in fields(ReadOptions)}


def keywords_of(*functions: Callable[..., Any]) -> list[str]:
    """The keyword names the functions accept (``self`` and ``*args``/``**kwargs`` aside)."""
    names: list[str] = []
    for function in functions:
        for p in inspect.signature(function).parameters.values():
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                if p.name not in names:
                    names.append(p.name)
    return names


def check_keywords(given: Iterable[str], known: Iterable[str], where: str) -> None:
    """Refuse a keyword ``where`` does not take, naming the closest known one and all of them.

    Raises:
        PackerError: a keyword of ``given`` is not in ``known``.
    """
    known = list(known)
    unknown = [name for name in given if name not in known]
    if not unknown:
        return
    name = unknown[0]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise PackerError(
        f"{where} takes no option {name!r}{hint}; it takes: {', '.join(sorted(known))}"
    )


def old_name(module: str, names: dict[str, Any], name: str) -> Any:
    """A module's ``__getattr__`` for names kept from before a rename: the object, with a
    ``DeprecationWarning`` naming the new name."""
    if name not in names:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new = names[name].__name__
    warnings.warn(
        f"packer.{name} is the old name of packer.{new}; use packer.{new}",
        DeprecationWarning,
        stacklevel=3,
    )
    return names[name]
