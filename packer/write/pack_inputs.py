"""What :func:`packer.pack` maps over: its inputs, how one input becomes samples, and the
fingerprint a resumed run must match.

An input is anything in a sequence (a path, an id, a tuple, ...) or an item of a map-style
``torch.utils.data.Dataset``. :func:`run_input` turns one input into its samples, in any process:
``fn(input)`` (or the item itself without ``fn``) gives a sample dict, ``None`` (the input is left
out) or an iterable of sample dicts (one input, many samples); a tuple is named by ``fields``.
Each sample's fields are encoded there (:func:`packer.write.writer_values.encode_fields`), so the
writing process only checks keys and writes. A sample without ``__key__`` is keyed by its input's
position (``000012``; ``000012_0``, ``000012_1``, ... for several samples of one input).
"""

from __future__ import annotations

import functools
import os
import pickle
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import xxhash

from packer.core.fields import FieldSpec
from packer.errors import PackerError
from packer.write.writer_values import DEFAULT_CHECK, DEFAULT_JPEG_QUALITY, Check, encode_fields

__all__ = [
    "Outcome",
    "PackSpec",
    "as_inputs",
    "describe_input",
    "fn_identity",
    "inputs_digest",
    "run_input",
]

KEY_DIGITS = 6  # the least width of a key made from an input's position
_REASON_CHARS = 500  # a skipped input's reason is cut to this


@dataclass(frozen=True)
class PackSpec:
    """What every worker needs to turn inputs into encoded samples (picklable when ``fn`` is)."""

    fn: Callable[[Any], Any] | None
    names: tuple[str, ...] | None  # the fields a tuple item or result is named by
    declared: dict[str, FieldSpec] | None
    jpeg_quality: int = DEFAULT_JPEG_QUALITY
    width: int = KEY_DIGITS
    check: Check = DEFAULT_CHECK  # how bytes given for an image or audio field are checked


@dataclass
class Outcome:
    """One input done: its encoded samples (``(key, fields)``, in order; none if ``fn`` left it
    out), or the reason it failed (``error``) and the traceback."""

    index: int
    samples: list[tuple[Any, dict[str, bytes]]] = field(default_factory=list)
    error: str | None = None
    trace: str = ""


def _is_iterable_dataset(obj: Any) -> bool:
    return any(c.__name__ == "IterableDataset" for c in type(obj).__mro__)


def as_inputs(inputs: Any) -> Sequence[Any]:
    """``inputs`` as a sequence to index: a list, tuple, range, array or map-style ``Dataset``
    as it is; another iterable (a generator) read into a list.

    Raises:
        PackerError: a string, a mapping, a torch ``IterableDataset`` or a non-iterable.
    """
    if isinstance(inputs, str | bytes | os.PathLike):
        raise PackerError(
            f"inputs={inputs!r} is one {type(inputs).__name__}, not a list of inputs: give "
            "[path, ...] (or on the command line a text file with one input per line)"
        )
    if isinstance(inputs, Mapping):
        raise PackerError(
            "inputs is a mapping: give a sequence (list(d.values()) or list(d.items()))"
        )
    if _is_iterable_dataset(inputs):
        raise PackerError(
            "inputs is an IterableDataset, which has no length or index to resume from: "
            "write its samples with packer.Writer in a loop, or give a map-style Dataset"
        )
    if hasattr(inputs, "__len__") and hasattr(inputs, "__getitem__"):
        return inputs
    if isinstance(inputs, Iterable):
        return list(inputs)
    raise PackerError(
        f"inputs is a {type(inputs).__name__}: expected a sequence, an iterable or a "
        "map-style torch Dataset"
    )


def _plain(inputs: Any) -> bool:
    """Whether ``inputs`` is a plain container (its items are the inputs; not a Dataset)."""
    return isinstance(inputs, list | tuple | range) or type(inputs).__module__ == "numpy"


def describe_input(inputs: Sequence[Any], index: int) -> str:
    """How a skipped input is listed: a path as itself, another input by position and value,
    a Dataset's item by position."""
    if not _plain(inputs):
        return f"item {index}"
    item = inputs[index]
    if isinstance(item, str | os.PathLike):
        return os.fspath(item)
    text = repr(item)
    return f"input {index}: {text if len(text) <= 120 else text[:117] + '...'}"


def _item_bytes(item: Any) -> bytes:
    """An input's part of the fingerprint: a path to a file with its size and mtime; another
    value pickled (or its repr)."""
    if isinstance(item, str | os.PathLike):
        path = os.fspath(item)
        try:
            info = os.stat(path)
            return f"{path!r}\t{info.st_size}\t{info.st_mtime_ns}\n".encode("utf-8", "replace")
        except (OSError, ValueError):
            return f"{path!r}\n".encode("utf-8", "replace")
    try:
        return pickle.dumps(item, protocol=4)
    except Exception:  # noqa: BLE001 - any value that does not pickle is fingerprinted by repr
        return repr(item).encode("utf-8", "replace")


def inputs_digest(inputs: Sequence[Any]) -> str:
    """The xxh3 of the inputs (each item of a plain sequence; a Dataset by its type, length and
    pickled state): a changed input list does not resume."""
    digest = xxhash.xxh3_64()
    if _plain(inputs):
        for item in inputs:
            digest.update(_item_bytes(item))
    else:
        cls = type(inputs)
        digest.update(f"{cls.__module__}.{cls.__qualname__}\t{len(inputs)}\n".encode())
        digest.update(_item_bytes(inputs))
    return digest.hexdigest()


def fn_identity(fn: Any) -> str | None:
    """``module:qualname#code-digest`` of ``fn`` (a ``partial`` with its arguments), so a
    resumed run with another function is refused; None without ``fn``."""
    if fn is None:
        return None
    if isinstance(fn, functools.partial):
        inner = fn_identity(fn.func)
        args = xxhash.xxh3_64(_item_bytes((fn.args, sorted(fn.keywords.items())))).hexdigest()
        return f"partial({inner})#{args}"
    code = getattr(fn, "__code__", None)
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    if code is None:  # a callable object: its class and state
        cls = type(fn)
        state = xxhash.xxh3_64(_item_bytes(fn)).hexdigest()
        return f"{cls.__module__}:{cls.__qualname__}#{state}"
    digest = xxhash.xxh3_64(code.co_code)
    digest.update(repr((code.co_consts, code.co_names)).encode("utf-8", "replace"))
    return f"{name}#{digest.hexdigest()}"


def _named(value: Any, spec: PackSpec, what: str) -> dict[str, Any]:
    """A tuple (or one value) named by ``spec.names``."""
    if spec.names is None:
        raise ValueError(
            f"{what} is a {type(value).__name__}, not a sample dict: pass fields=(...) to name "
            "its parts, e.g. fields=('jpg', 'cls')"
        )
    parts = tuple(value) if isinstance(value, tuple | list) else (value,)
    if len(parts) != len(spec.names):
        raise ValueError(
            f"{what} has {len(parts)} part(s) for the {len(spec.names)} fields "
            f"{', '.join(spec.names)}"
        )
    return dict(zip(spec.names, parts, strict=True))


def _samples_of(result: Any, spec: PackSpec) -> list[Mapping[str, Any]]:
    """What ``fn`` (or the item) gave, as sample dicts."""
    what = "fn's result" if spec.fn is not None else "the item"
    if result is None:
        return []
    if isinstance(result, Mapping):
        return [result]
    if isinstance(result, tuple) and not all(isinstance(p, Mapping) for p in result):
        return [_named(result, spec, what)]
    if isinstance(result, str | bytes) or not isinstance(result, Iterable):
        if spec.names is not None and spec.fn is None:
            return [_named(result, spec, what)]
        raise ValueError(
            f"{what} is a {type(result).__name__}: expected a sample dict, None, or an "
            "iterable of sample dicts"
        )
    samples = list(result)
    for number, sample in enumerate(samples):
        if not isinstance(sample, Mapping):
            raise ValueError(
                f"{what}'s sample {number} is a {type(sample).__name__}, not a dict of fields"
            )
    return samples


def _key(index: int, number: int, count: int, width: int) -> str:
    base = f"{index:0{width}d}"
    return base if count == 1 else f"{base}_{number}"


def run_input(inputs: Sequence[Any], index: int, spec: PackSpec, offset: int = 0) -> Outcome:
    """Input ``index`` (of ``inputs``, which start at position ``offset`` of all the inputs) as
    encoded samples, or the reason it failed (any exception of ``fn``, of reading the item, or
    of encoding a value: the input is then skipped, or with ``strict`` the run stops)."""
    try:
        item = inputs[index - offset]
        result = item if spec.fn is None else spec.fn(item)
        samples = _samples_of(result, spec)
        encoded = []
        for number, sample in enumerate(samples):
            key = sample.get("__key__", _key(index, number, len(samples), spec.width))
            fields = encode_fields(str(key), sample, spec.declared, spec.jpeg_quality, spec.check)
            encoded.append((key, fields))
        return Outcome(index, encoded)
    except Exception as exc:  # noqa: BLE001 - the user's code: any failure skips its input
        reason = f"{type(exc).__name__}: {exc}"
        if len(reason) > _REASON_CHARS:
            reason = reason[: _REASON_CHARS - 3] + "..."
        return Outcome(index, error=reason, trace=traceback.format_exc())
