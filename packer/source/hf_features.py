"""Hugging Face sources: what a Parquet or Arrow file of ``datasets`` holds, and where the files are.

``datasets`` describes a table by its *features*, a JSON object stored in the Arrow schema's
metadata under the key ``huggingface`` (``{"info": {"features": {...}}}``; also in a
``save_to_disk`` folder's ``dataset_info.json``). Each column becomes one :class:`Column`:

============================== =========================================== ===================
feature                        Arrow type                                  stored as
============================== =========================================== ===================
``Image``                      ``struct<bytes: binary, path: string>``     an ``image`` field
``Audio``                      the same struct                             an ``audio`` field
``ClassLabel(names=[...])``    an integer                                  the label (names:
                                                                           the classes)
``Value("string")``            ``string``                                  ``text``
``Value("int64")``, ...        an integer                                  ``int``
``Value("binary")``            ``binary``                                  ``bytes``
``Value`` of dates, decimals   ``timestamp``, ``decimal128``, ...          ISO or decimal text
anything else (``List``,       lists, structs, floats, booleans            ``json``
``Sequence``, a dict, floats)
============================== =========================================== ===================

A file without the metadata has its features read from its Arrow types (a
``struct<bytes, path>`` column is an image). A column nesting binary values inside lists or
structs (``List(Image())``) cannot be JSON and is left out, its reason recorded.

:func:`hf_source` tells a Hugging Face source from any other, reading only a schema or a small
JSON file: a ``.parquet`` file with the metadata or an image struct, an ``.arrow`` file, a
``save_to_disk`` folder (``state.json`` naming its ``*.arrow`` files, ``dataset_info.json``), a
``DatasetDict`` folder (``dataset_dict.json`` and a folder per split), a folder of Parquet
files (``train-00000-of-00002.parquet``: the split is the name's first part) and a glob or brace
pattern of Parquet files.
"""

from __future__ import annotations

import glob
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import SourceError
from packer.source.tars import expand_braces

__all__ = ["Column", "HFSource", "columns_of", "hf_source", "schema_of"]

_SHARD_NAME = re.compile(r"(?P<split>[A-Za-z0-9_.]+?)-\d{5}-of-\d{5}\.parquet")
_SPLIT_ORDER = ("train", "validation", "val", "test")
_MAX_JSON = 1 << 24  # a dataset_info.json, state.json or dataset_dict.json beyond it is not one
STORED = {"image": "image", "audio": "audio", "label": "int"}  # the field kind of a column kind


@dataclass(frozen=True)
class Column:
    """One column: its name, its kind (``image``, ``audio``, ``label``, ``text``, ``int``,
    ``json``, ``bytes``, or ``none`` for a column left out, ``why`` saying why), and a
    ClassLabel's ``names``."""

    name: str
    kind: str
    names: tuple[str, ...] = ()
    why: str = ""

    @property
    def field_kind(self) -> str:
        """The kind of the field the column is stored as."""
        return STORED.get(self.kind, self.kind)


@dataclass(frozen=True)
class HFSource:
    """A Hugging Face source: its ``format`` (``parquet`` or ``arrow``), the files of each split
    (one split named ``""`` when it is a single dataset) and the features a ``dataset_info.json``
    gives (else each file's schema metadata)."""

    root: Path
    format: str
    files: dict[str, list[str]]
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    what: str = ""

    @property
    def splits(self) -> list[str]:
        """The split names, train first ([] for a single dataset)."""
        return [] if list(self.files) == [""] else list(self.files)


def _is_image_struct(dtype: Any) -> bool:
    import pyarrow as pa

    if not pa.types.is_struct(dtype):
        return False
    names = {dtype.field(i).name for i in range(dtype.num_fields)}
    return names == {"bytes", "path"}


def _holds_binary(dtype: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return True
    if pa.types.is_fixed_size_binary(dtype):
        return True
    if pa.types.is_struct(dtype):
        return any(_holds_binary(dtype.field(i).type) for i in range(dtype.num_fields))
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return _holds_binary(dtype.value_type)
    if pa.types.is_fixed_size_list(dtype) or pa.types.is_map(dtype):
        return _holds_binary(dtype.value_type) if hasattr(dtype, "value_type") else True
    return False


def _value_kind(dtype: Any) -> str:
    """The kind of a plain column from its Arrow type."""
    import pyarrow as pa

    t = pa.types
    if t.is_string(dtype) or t.is_large_string(dtype):
        return "text"
    if t.is_integer(dtype):
        return "int"
    if t.is_binary(dtype) or t.is_large_binary(dtype):
        return "bytes"
    if t.is_temporal(dtype) or t.is_decimal(dtype):
        return "text"  # ISO text, decimal strings (as a table's Parquet columns)
    if t.is_null(dtype):
        return "none"
    return "json"


def _names(feature: dict[str, Any], name: str, where: str) -> tuple[str, ...]:
    names = feature.get("names")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SourceError(
            f"{where}: column {name!r} is a ClassLabel without a list of names in its "
            "'huggingface' metadata; save it again with datasets, or drop the metadata"
        )
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise SourceError(f"{where}: ClassLabel {name!r} names class {twice!r} twice")
    return tuple(names)


def columns_of(schema: Any, features: dict[str, Any] | None, where: str) -> list[Column]:
    """The columns of an Arrow ``schema`` under ``features`` (the ``datasets`` features JSON;
    None: from the schema's own metadata, else from the Arrow types), in the schema's order.

    Raises:
        SourceError: a ClassLabel without usable names.
    """
    if features is None:
        features = schema_features(schema)
    out = []
    for item in schema:
        name, dtype = item.name, item.type
        feature = features.get(name)
        kind_of = feature.get("_type") if isinstance(feature, dict) else None
        if kind_of == "ClassLabel":
            out.append(Column(name, "label", _names(feature, name, where)))  # type: ignore[arg-type]
        elif kind_of in ("Image", "Audio") or (kind_of is None and _is_image_struct(dtype)):
            if not _is_image_struct(dtype):
                out.append(Column(name, "none", why=f"a {kind_of} column of type {dtype}"))
            else:
                out.append(Column(name, "audio" if kind_of == "Audio" else "image"))
        elif _holds_binary(dtype) and not _value_kind(dtype) == "bytes":
            what = kind_of or str(dtype)
            out.append(Column(name, "none", why=f"{what} nests binary values (not JSON)"))
        else:
            kind = _value_kind(dtype)
            out.append(Column(name, kind, why="a column of nulls" if kind == "none" else ""))
    return out


def schema_features(schema: Any) -> dict[str, Any]:
    """The features JSON of an Arrow schema's ``huggingface`` metadata ({} when it has none or
    it does not parse)."""
    meta = schema.metadata or {}
    raw = meta.get(b"huggingface")
    if raw is None:
        return {}
    try:
        info = json.loads(raw)
    except ValueError:
        return {}
    features = info.get("info", {}).get("features") if isinstance(info, dict) else None
    return features if isinstance(features, dict) else {}


def schema_of(path: str) -> Any:
    """The Arrow schema of a Parquet or Arrow (IPC stream) file.

    Raises:
        SourceError: the file cannot be read as one.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.lower().endswith(".parquet"):
            return pq.read_schema(path)
        with pa.memory_map(path) as mm:
            return pa.ipc.open_stream(mm).schema
    except Exception as exc:  # pyarrow's ArrowInvalid / OSError family
        what = "Parquet" if path.lower().endswith(".parquet") else "an Arrow stream"
        raise SourceError(f"{path!r} cannot be read as {what}: {exc}") from exc


def _json(path: Path) -> Any:
    try:
        if path.stat().st_size > _MAX_JSON:
            raise SourceError(f"{str(path)!r} is over {_MAX_JSON >> 20} MiB: not a datasets file")
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise SourceError(f"{str(path)!r} cannot be read as JSON: {exc}") from exc


def _plain(name: Any, where: str, what: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or "\0" in name:
        raise SourceError(f"{where} names {what} {name!r}, not a plain name in its folder")
    return name


def _saved(folder: Path) -> tuple[list[str], dict[str, Any]]:
    """The ``*.arrow`` files of a ``save_to_disk`` folder (``state.json``) and its features."""
    state = _json(folder / "state.json")
    where = repr(str(folder / "state.json"))
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(entries, list) or not entries:
        raise SourceError(f"{where} lists no data files (_data_files); save the dataset again")
    files = []
    for entry in entries:
        name = entry.get("filename") if isinstance(entry, dict) else None
        files.append(str(folder / _plain(name, where, "data file")))
    info_path = folder / "dataset_info.json"
    info = _json(info_path) if info_path.is_file() else {}
    features = info.get("features") if isinstance(info, dict) else None
    return files, features if isinstance(features, dict) else {}


def _ordered(names: list[str]) -> list[str]:
    rank = {s: i for i, s in enumerate(_SPLIT_ORDER)}
    return sorted(names, key=lambda s: (rank.get(s.lower(), len(rank)), s))


def _parquet_folder(folder: Path) -> HFSource | None:
    """A folder holding Parquet files (and nothing else but hidden files) with HF features."""
    names = []
    try:
        with os.scandir(folder) as entries:
            for entry in entries:  # a class tree or a million images: its first name says no
                if entry.name.startswith("."):
                    continue
                if not entry.name.lower().endswith(".parquet"):
                    return None
                names.append(entry.name)
    except OSError:
        return None
    names.sort()
    if not names or not schema_features(_schema_or_none(folder / names[0])):
        return None
    files = _by_split([str(folder / n) for n in names])
    return HFSource(folder, "parquet", files, what=f"{len(names)} Parquet files of datasets")


def _by_split(paths: list[str]) -> dict[str, list[str]]:
    """Parquet files by split when every name is ``<split>-00000-of-00002.parquet``, else all
    in one dataset (split ``""``)."""
    matched = [_SHARD_NAME.fullmatch(os.path.basename(p)) for p in paths]
    files: dict[str, list[str]] = {}
    if all(matched):
        for m, p in zip(matched, paths):
            files.setdefault(m.group("split") if m else "", []).append(p)
        files = {s: files[s] for s in _ordered(list(files))}
    if len(files) <= 1:
        return {"": paths}
    return files


def _pattern(pattern: str) -> HFSource | None:
    """The Parquet files a glob or brace pattern names (``data/train-*.parquet``,
    ``data/train-{00000..00007}-of-00008.parquet``), or None when it is no such pattern.

    Raises:
        SourceError: a pattern of Parquet files that matches none.
    """
    if not pattern.lower().endswith(".parquet") or not any(c in pattern for c in "*?[{"):
        return None
    names = [n for p in expand_braces(pattern) for n in (sorted(glob.glob(p)) or [p])]
    paths = list(dict.fromkeys(n for n in names if os.path.isfile(n)))
    if not paths:
        raise SourceError(f"{pattern!r} matches no Parquet file")
    what = f"{len(paths)} Parquet files of datasets matching {pattern!r}"
    return HFSource(Path(paths[0]).parent, "parquet", _by_split(paths), what=what)


def _schema_or_none(path: Path) -> Any:
    try:
        return schema_of(str(path))
    except SourceError:
        return _Empty()


class _Empty:
    metadata: dict[bytes, bytes] = {}


def hf_source(src: str | os.PathLike[str]) -> HFSource | None:
    """The Hugging Face source ``src`` is, or None when it is none (see the module docstring).

    Raises:
        SourceError: a ``datasets`` folder whose JSON files do not say where its data is.
    """
    path = Path(src)
    suffix = path.suffix.lower()
    if path.is_file():
        if suffix == ".arrow":
            return HFSource(path.parent, "arrow", {"": [str(path)]}, what="an Arrow file")
        if suffix != ".parquet":
            return None
        schema = _schema_or_none(path)
        if isinstance(schema, _Empty):
            return None  # the table reader says why it cannot be read
        if not schema_features(schema) and not any(_is_image_struct(f.type) for f in schema):
            return None  # a plain table of image paths
        return HFSource(
            path.parent, "parquet", {"": [str(path)]}, what="a Parquet file of datasets"
        )
    if not path.is_dir():
        return None if path.exists() else _pattern(os.fspath(src))
    if (path / "dataset_dict.json").is_file():
        listed = _json(path / "dataset_dict.json")
        where = repr(str(path / "dataset_dict.json"))
        splits = listed.get("splits") if isinstance(listed, dict) else None
        if not isinstance(splits, list) or not splits:
            raise SourceError(f"{where} lists no splits; save the DatasetDict again")
        files, features = {}, {}
        for split in splits:
            _plain(split, where, "split")
            files[split], features[split] = _saved(path / split)
        what = f"a DatasetDict of {len(files)} splits (save_to_disk)"
        return HFSource(path, "arrow", files, features, what)
    if (path / "state.json").is_file():
        files_of, features_of = _saved(path)
        what = f"a saved dataset of {len(files_of)} Arrow file(s) (save_to_disk)"
        return HFSource(path, "arrow", {"": files_of}, {"": features_of}, what)
    return _parquet_folder(path)
