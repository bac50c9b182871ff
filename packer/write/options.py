"""A conversion's options, typed: one frozen :class:`ConvertOptions` built once.

The command line and :func:`packer.convert` build it, :func:`packer.write.plan.plan_conversion`
takes it, and its parts travel on to the loaders: :class:`Limits` (what is skipped before it is
read or decoded), :class:`packer.decode.resize.Resize` (write-time resize), :class:`VideoOptions`,
:class:`FieldOptions` (the options of sources of samples with fields). Each option is declared
once, here, with its type: a value of the wrong type, or a name no part declares, is refused when
the options are built, by name (with the closest name for a misspelled one). A part's option may
be given by its own name (``ConvertOptions(max_side=256)``) or as the part
(``ConvertOptions(resize=Resize(max_side=256))``); the first overrides the second.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from packer.core.sizes import parse_size
from packer.decode.check import DEFAULT_CHECK, DEFAULT_MAX_PIXELS
from packer.decode.resize import Resize
from packer.errors import PackerError

__all__ = [
    "DEFAULT_MAX_FILE_SIZE",
    "DEFAULT_SHARD_SIZE",
    "ConvertOptions",
    "FieldOptions",
    "Limits",
    "Resize",
    "VideoOptions",
    "given",
    "options_of",
]

DEFAULT_SHARD_SIZE = 1 << 30
DEFAULT_MAX_FILE_SIZE = 64_000_000


def _tuple(value: Any) -> Any:
    """A list or tuple as a tuple (anything else as given: the type check names it)."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def _names(value: Any) -> Any:
    """``"a,b"`` or a list of names → ``("a", "b")``."""
    if isinstance(value, str):
        return tuple(n for n in value.split(",") if n)
    return _tuple(value)


def _paths(value: Any) -> Any:
    """A list of paths → a tuple of their texts."""
    value = [value] if isinstance(value, (str, os.PathLike)) else value
    if isinstance(value, (list, tuple)):
        return tuple(os.fspath(v) if isinstance(v, (str, os.PathLike)) else v for v in value)
    return value


def _size(name: str) -> Callable[[Any], Any]:
    def parse(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return value  # refused by the type check, naming what was found
        try:
            return parse_size(value)
        except PackerError as exc:
            raise PackerError(f"option {name}: {exc}") from None

    return parse


def _default_if_none(default: Any) -> Callable[[Any], Any]:
    return lambda value: default if value is None else value


def _describe(hint: Any) -> str:
    """What a type hint accepts, in words."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if hint is type(None):
        return "None"
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0]).removeprefix('an ').removeprefix('a ')}"
        plain = (_describe(a).removeprefix("an ").removeprefix("a ") for a in args)
        return f"a pair ({', '.join(plain)})"
    words = {bool: "True or False", int: "an int", float: "a number", str: "a str"}
    if hint in words:
        return words[hint]
    names = {dict: "a dict", Mapping: "a mapping", os.PathLike: "a path", Callable: "a callable"}
    return names.get(origin or hint, f"a {getattr(hint, '__name__', hint)}")


def _accepts(value: Any, hint: Any) -> bool:
    """Whether ``value`` is of the type ``hint`` describes (the hints options use)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_accepts(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint in (int, float) and isinstance(value, bool):
        return False
    if hint is float:
        return isinstance(value, (int, float))
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_accepts(v, args[0]) for v in value)
        return len(value) == len(args) and all(map(_accepts, value, args))
    if origin is Callable:
        return callable(value)
    return isinstance(value, origin or hint)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _checked(cls: type, name: str, value: Any, coerce: Mapping[str, Callable[[Any], Any]]) -> Any:
    """``value`` of option ``name`` of ``cls``, normalized, or a PackerError saying what it
    should be."""
    hint = _hints(cls)[name]
    normal = coerce[name](value) if name in coerce else value
    if not _accepts(normal, hint):
        raise PackerError(
            f"option {name!r} is {value!r} ({type(value).__name__}); expected {_describe(hint)}"
        )
    return normal


def _unknown(owner: str, name: str, value: Any, known: list[str]) -> PackerError:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; it takes {', '.join(known)}"
    return PackerError(f"unknown option {name!r} (given {value!r}) of {owner}{hint}")


def given(part: Any) -> dict[str, Any]:
    """The options of ``part`` that differ from their defaults (the ones a user gave)."""
    defaults = type(part)()
    return {
        f.name: getattr(part, f.name)
        for f in dataclasses.fields(part)
        if f.compare and getattr(part, f.name) != getattr(defaults, f.name)
    }


class _Typed:
    """A frozen dataclass whose constructor checks each value against its field's type (and
    normalizes it first through ``_COERCE``); an unknown name is a PackerError."""

    _COERCE: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    def __init__(self, *args: Any, **values: Any) -> None:
        names = [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]
        owner = type(self).__name__
        if len(args) > len(names):
            raise PackerError(f"{owner} takes at most {len(names)} values by position")
        for name, value in zip(names, args):
            if name in values:
                raise PackerError(f"option {name!r} of {owner} given twice")
            values[name] = value
        for name, value in values.items():
            if name not in names:
                raise _unknown(owner, name, value, self._known())
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            if f.name in values:
                value = _checked(type(self), f.name, values[f.name], self._COERCE)
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, f.name, value)
        self._check()

    def _known(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]

    def _check(self) -> None:
        """Refuse values of the right type but out of range (a subclass's rules)."""


@dataclass(frozen=True, init=False)
class Limits(_Typed):
    """Inputs skipped (and listed) before they are read or decoded."""

    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    max_pixels: int = DEFAULT_MAX_PIXELS

    _COERCE: ClassVar[dict[str, Callable[[Any], Any]]] = {"max_file_size": _size("max_file_size")}

    def _check(self) -> None:
        if self.max_pixels < 1:
            raise PackerError(f"invalid max_pixels {self.max_pixels}; expected 1 or more")


@dataclass(frozen=True, init=False)
class VideoOptions(_Typed):
    """Video only: keep at most ``fps`` frames a second of a video file; ``skip_bad_frames``
    drops (and records) a bad frame instead of skipping its video."""

    fps: float | None = None
    skip_bad_frames: bool = False

    _COERCE: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "skip_bad_frames": _default_if_none(False)
    }

    def _check(self) -> None:
        if self.fps is not None and self.fps <= 0:
            raise PackerError(f"invalid fps {self.fps}; expected a positive number")


@dataclass(frozen=True, init=False)
class FieldOptions(_Typed):
    """Sources of samples with fields: the fields a sample must have (``require``), a table's
    image column, COCO's annotation files, and whether a link leaving the source is read."""

    require: tuple[str, ...] = ()
    image_column: str | None = None
    annotations: tuple[str, ...] = ()
    follow_links: bool = False

    _COERCE: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "require": _names,
        "annotations": _paths,
        "follow_links": bool,
    }


_PARTS: dict[str, type] = {
    "limits": Limits,
    "resize": Resize,
    "video": VideoOptions,
    "fields": FieldOptions,
}
_PART_OPTIONS = {
    n: p for p, cls in _PARTS.items() for n in (f.name for f in dataclasses.fields(cls))
}
_RESIZE_COERCE = {"quality": _default_if_none(90), "reencode": _default_if_none(False)}
_Hook = Callable[..., Any]


@dataclass(frozen=True, init=False)
class ConvertOptions(_Typed):
    """Every option of one conversion (:func:`packer.convert`'s keywords, same names and
    meaning), checked and normalized: sizes in bytes, names and paths as tuples. ``executor``
    and ``after_shard`` say where and how shards are written, not what they hold: they are
    left out of comparisons, and ``executor`` out of a pickle."""

    format: str | None = None
    shard_size: int = DEFAULT_SHARD_SIZE
    workers: int | None = None
    overwrite: bool = False
    strict: bool = False
    check: str = DEFAULT_CHECK
    resume: bool = False
    progress: bool = True
    kind: str | None = None
    split: tuple[str, ...] | None = None
    classes: tuple[str, ...] | None = None
    labels: str | os.PathLike[str] | Mapping[str, Any] | None = None
    allow_empty: bool = False
    part: tuple[int, int] | None = None
    source_options: dict[str, Any] | None = None
    size: int | None = None  # into .npy: decoded size×size pixels
    limits: Limits = field(default_factory=Limits)
    resize: Resize = field(default_factory=Resize)
    video: VideoOptions = field(default_factory=VideoOptions)
    fields: FieldOptions = field(default_factory=FieldOptions)
    on_event: _Hook | None = None
    executor: Any = field(default=None, compare=False, repr=False)
    after_shard: _Hook | None = field(default=None, compare=False, repr=False)

    _COERCE: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "shard_size": _size("shard_size"),
        "split": _names,
        "classes": _tuple,
        "part": _tuple,
        "source_options": lambda v: dict(v) if isinstance(v, Mapping) else v,
    }

    def __init__(self, *args: Any, **values: Any) -> None:
        for name, cls in _PARTS.items():
            mine = {k: values.pop(k) for k in list(values) if _PART_OPTIONS.get(k) == name}
            if mine:
                part = values.get(name, cls())
                if not isinstance(part, cls):
                    raise PackerError(
                        f"option {name!r} is {part!r} ({type(part).__name__}); expected a "
                        f"{cls.__name__}"
                    )
                values[name] = _with(part, mine)
        super().__init__(*args, **values)

    def _known(self) -> list[str]:
        return [*super()._known(), *_PART_OPTIONS]

    def _check(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise PackerError(f"invalid workers {self.workers}; expected 1 or more")

    def keywords(self) -> dict[str, Any]:
        """These options as :func:`packer.convert`'s keywords, those given only."""
        flat = {k: v for p in _PARTS for k, v in given(getattr(self, p)).items()}
        top = {k: v for k, v in given(self).items() if k not in _PARTS}
        hooks = {k: getattr(self, k) for k in ("executor", "after_shard")}
        return {**top, **flat, **{k: v for k, v in hooks.items() if v is not None}}

    def kind_options(self) -> dict[str, Any]:
        """The options given of the source's kind: resize, ``size``, video, fields."""
        named = {"size": self.size} if self.size is not None else {}
        fields_given = {k: v for k, v in given(self.fields).items() if k != "follow_links"}
        return {**given(self.resize), **named, **given(self.video), **fields_given}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "executor": None}  # a live client stays where it is


def _with(part: Any, values: dict[str, Any]) -> Any:
    """``part`` with ``values`` replacing its options, each checked."""
    if isinstance(part, _Typed):
        held = {f.name: getattr(part, f.name) for f in dataclasses.fields(part)}  # type: ignore[arg-type]
        return type(part)(**{**held, **values})
    checked = {k: _checked(type(part), k, v, _RESIZE_COERCE) for k, v in values.items()}
    return dataclasses.replace(part, **checked)


def options_of(options: ConvertOptions | None, keywords: Mapping[str, Any]) -> ConvertOptions:
    """``options`` (default: the defaults) with ``keywords`` replacing some of them: what
    :func:`packer.convert` and :func:`packer.write.plan.plan_conversion` take."""
    if options is None:
        return ConvertOptions(**keywords)
    if not isinstance(options, ConvertOptions):
        raise PackerError(f"options is {options!r}; expected a ConvertOptions")
    return dataclasses.replace(options, **keywords) if keywords else options
