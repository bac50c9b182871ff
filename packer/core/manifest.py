"""The manifest ``packer.json`` and the numpy sample and record tables, declared once.

A packed dataset is a directory::

    out.lmdb/
      packer.json     manifest, written last and atomically: its presence means "complete"
      index.npy       one SAMPLE_DTYPE row per sample: label, count (records), first (record)
      records.npy     one RECORD_DTYPE row per record: file, length, offset, checksum
      keys.txt        one sample key per line, in sample order
      ...             the format's data files

A sample is a run of ``count`` consecutive records starting at ``first``: an image is one record,
a clip's video is one record per frame. A record's ``file`` is the shard number (layout
``"shards"``) or the sample number (layout ``"per-sample"``: the file is named after the
sample's key); ``offset`` is where its bytes start in that file (an LMDB record number for
LMDB). A manifest looks like (``samples`` of a shard counts its records)::

    {"format": "lmdb", "layout_version": 2, "kind": "image", "num_samples": 1281167, "classes":
     ["n01440764", ...], "shards": [{"name": "shard-00000.mdb", "samples": 9000, "bytes": 1073741824,
     "xxh3_64": "9f1c..."}], "skipped": [{"path": "...", "reason": "..."}], "files": {"index.npy":
     "...", ...}, "source": {"root": "/data/train", "files": 1281168, "bytes": 140000000000},
     "options": {"layout": "shards", ...}, "packer_version": "0.2.0", "created": "..."}
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from packer._version import __version__
from packer.core import manifest_schema as schema
from packer.core.keytable import escape_key, unescape_key
from packer.core.manifest_options import ManifestOptions, parse_options
from packer.core.manifest_schema import Invalid, check_manifest, check_manifest_size
from packer.core.tablefile import check_runs, fd_checksum, parse_table, read_checked, temp_name
from packer.errors import FormatError

__all__ = [
    "INDEX_NAME",
    "KEYS_NAME",
    "LAYOUT_VERSION",
    "MANIFEST_NAME",
    "RECORDS_NAME",
    "RECORD_DTYPE",
    "SAMPLE_DTYPE",
    "Manifest",
    "ShardInfo",
    "bytes_checksum",
    "decode_keys",
    "encode_keys",
    "file_checksum",
    "fsync_dir",
    "load_index",
    "load_keys",
    "load_manifest",
    "parse_manifest",
    "load_records",
    "read_checked",
    "shard_name",
    "write_index",
    "write_keys",
    "write_manifest",
    "write_records",
]

LAYOUT_VERSION = 2
MANIFEST_NAME = "packer.json"
INDEX_NAME = "index.npy"
RECORDS_NAME = "records.npy"
KEYS_NAME = "keys.txt"

# Explicit little-endian dtypes: the tables read the same on any machine.
SAMPLE_DTYPE = np.dtype([("label", "<i4"), ("count", "<i4"), ("first", "<i8")])
RECORD_DTYPE = np.dtype(
    [
        ("file", "<i4"),  # shard number, or sample number in a per-sample layout
        ("length", "<u4"),  # stored byte length
        ("offset", "<i8"),  # byte offset in the file (LMDB: record number in the shard)
        ("checksum", "<u8"),  # xxh3_64 of the stored bytes
    ]
)


def shard_name(number: int, suffix: str) -> str:
    """The file name of shard ``number``: ``shard-00003.mdb``."""
    return f"shard-{number:05d}{suffix}"


def bytes_checksum(data: bytes | memoryview) -> int:
    """xxh3_64 of a sample's bytes (about 10 GB/s, so checking costs far less than reading)."""
    return int(xxhash.xxh3_64_intdigest(data))


def file_checksum(path: str | os.PathLike[str]) -> str:
    """xxh3_64 hex digest of a whole file (:func:`packer.core.tablefile.fd_checksum`: 1 MiB reads;
    measured on a cached 41 MB file: 5 ms, against 21 ms with 8 MiB chunks)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return fd_checksum(fd)
    finally:
        os.close(fd)


@dataclass
class ShardInfo:
    """One data file of a packed dataset."""

    name: str
    samples: int
    bytes: int
    xxh3_64: str


@dataclass
class Manifest:
    """What ``packer.json`` holds."""

    format: str
    kind: str
    num_samples: int
    classes: list[str]
    shards: list[ShardInfo]
    skipped: list[dict[str, str]] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)  # as found: .opts reads them
    files: dict[str, str] = field(default_factory=dict)  # index/keys file name -> xxh3_64
    layout_version: int = LAYOUT_VERSION
    packer_version: str = ""
    created: str = ""

    @cached_property
    def opts(self) -> ManifestOptions:
        """The options typed (:mod:`packer.core.manifest_options`), parsed by :meth:`from_dict`."""
        return parse_options(self.options, None)  # one being built (an empty part's): types only

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "opts"}  # pickled small: parsed again

    @property
    def class_to_idx(self) -> dict[str, int]:
        """Map class name to label."""
        return {name: i for i, name in enumerate(self.classes)}

    @property
    def data_bytes(self) -> int:
        """Total bytes of the data files."""
        return sum(s.bytes for s in self.shards)

    def digest(self, name: str, where: str) -> str:
        """The xxh3 the manifest records for table ``name`` of the dataset at ``where``.

        Raises:
            FormatError: none is recorded (a damaged or crafted manifest).
        """
        found = self.files.get(name) if isinstance(self.files, dict) else None
        if not isinstance(found, str):
            raise FormatError(
                f"{where!r}: the manifest records no checksum for {name} (found {found!r}); "
                "the dataset is damaged or crafted. Convert the source again"
            )
        return found

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "manifest") -> Manifest:
        """Build from parsed JSON, every field checked (:mod:`packer.core.manifest_schema`), the
        options typed (:attr:`opts`); fields this packer does not know are dropped (options: kept).

        Raises:
            FormatError: a field is missing, of the wrong type or out of range, naming
                ``where`` (the file), the field, the value found and what was expected.
        """
        try:
            check_manifest(data)
            opts = parse_options(data["options"], data["kind"])
        except Invalid as exc:
            raise FormatError(
                f"{where} is not a valid packer manifest: {exc}. It was damaged or edited; "
                "convert the source again (packer convert SRC DST --overwrite)"
            ) from None
        data = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        data["shards"] = [
            ShardInfo(s["name"], s["samples"], s["bytes"], s["xxh3_64"]) for s in data["shards"]
        ]
        manifest = cls(**data)
        manifest.__dict__["opts"] = opts  # what the cached property would parse again
        return manifest


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the names created in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, payload: bytes | Iterable[bytes]) -> None:
    tmp = path.with_name(temp_name(path.name))
    with open(tmp, "wb") as fh:
        fh.writelines([payload] if isinstance(payload, bytes) else payload)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def write_manifest(root: str | os.PathLike[str], manifest: Manifest) -> None:
    """Write ``packer.json`` atomically, in ASCII JSON (a non-UTF-8 name round-trips as \\udcXX)."""
    manifest.packer_version = __version__
    manifest.created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    data = manifest.to_dict()
    data["trusted_xxh3_64"] = schema.trusted_digest(data)  # checked by parse_manifest
    payload = json.dumps(data, indent=1).encode("ascii")
    _write_atomic(Path(root) / MANIFEST_NAME, payload)
    fsync_dir(Path(root))


def load_manifest(root: str | os.PathLike[str]) -> Manifest:
    """Load and check ``root/packer.json``.

    Raises:
        FormatError: no manifest (incomplete or not a packer output), unparsable, or a newer layout.
    """
    root = Path(root)
    path = root / MANIFEST_NAME
    if not path.is_file():
        hint = " (an interrupted conversion leaves no manifest; convert again)" * root.is_dir()
        raise FormatError(
            f"{str(root)!r} is not a complete packer dataset: no {MANIFEST_NAME}{hint}"
        )
    try:
        check_manifest_size(str(path), path.stat().st_size)
        raw = path.read_bytes()
    except OSError as exc:
        raise FormatError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from exc
    return parse_manifest(raw, str(path), str(root))


def parse_manifest(raw: bytes, path: str, root: str) -> Manifest:
    """The manifest whose bytes ``raw`` were read from ``path`` (a file or a URL) of the
    dataset ``root``, checked as :func:`load_manifest` does (bounded in bytes and shards)."""
    check_manifest_size(path, len(raw))
    try:
        data = json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # not UTF-8, not JSON, a number of over 4,300 digits
        raise FormatError(f"{path!r} is not a valid packer manifest: {exc}") from exc
    except RecursionError as exc:
        raise FormatError(f"{path!r} is not a valid packer manifest: nested too deep") from exc
    version = data.get("layout_version") if isinstance(data, dict) else None
    if isinstance(version, bool) or not isinstance(version, int):  # from_dict says what is wrong
        return Manifest.from_dict(data, repr(path))
    if version > LAYOUT_VERSION:
        raise FormatError(
            f"{path!r} has layout version {version!r}; this packer reads up to "
            f"version {LAYOUT_VERSION}: upgrade packer"
        )
    if version < LAYOUT_VERSION:
        source = data.get("source")
        src = (source.get("root") if isinstance(source, dict) else None) or "SRC"
        raise FormatError(
            f"{root!r} was written by an older packer (layout version {version}); this "
            f"packer reads version {LAYOUT_VERSION}. Convert it again: packer convert "
            f"{src} {root} --overwrite"
        )
    manifest = Manifest.from_dict(data, repr(path))
    schema.check_trusted(data, repr(path))
    return manifest


def _write_table(path: Path, table: np.ndarray, dtype: np.dtype) -> str:
    tmp = path.with_name(temp_name(path.name))
    with open(tmp, "wb") as fh:
        np.save(fh, np.ascontiguousarray(table, dtype=dtype), allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return file_checksum(path)


def _load_table(
    root: Path,
    name: str,
    dtype: np.dtype,
    what: str,
    mmap: bool,
    digest: str | None,
    dir_fd: int | None,
) -> np.ndarray:
    buf, _ = read_checked(root, name, digest, mmap, dir_fd)
    return parse_table(buf, root / name, dtype, what)


def write_index(root: str | os.PathLike[str], index: np.ndarray) -> str:
    """Write ``index.npy`` (the sample table) durably and atomically; return its checksum."""
    return _write_table(Path(root) / INDEX_NAME, index, SAMPLE_DTYPE)


def write_records(root: str | os.PathLike[str], records: np.ndarray) -> str:
    """Write ``records.npy`` (the record table) durably and atomically; return its checksum."""
    return _write_table(Path(root) / RECORDS_NAME, records, RECORD_DTYPE)


def load_index(
    root: str | os.PathLike[str],
    manifest: Manifest,
    mmap: bool = False,
    dir_fd: int | None = None,
    check: bool = True,
) -> np.ndarray:
    """Load ``index.npy`` (``mmap``: map it read-only, as datasets do) from the dataset folder
    (``dir_fd``, or ``root``), check its bytes against the manifest's checksum (unless not
    ``check``) and its length against ``num_samples``.

    Raises:
        FormatError: missing, a link, unreadable, damaged, wrong dtype, or a length other than
            ``num_samples``.
    """
    root = Path(root)
    digest = manifest.digest(INDEX_NAME, str(root)) if check and manifest else None
    index = _load_table(root, INDEX_NAME, SAMPLE_DTYPE, "index", mmap, digest, dir_fd)
    if len(index) != manifest.num_samples:
        raise FormatError(
            f"index {str(root / INDEX_NAME)!r} has {len(index)} rows but the manifest says "
            f"{manifest.num_samples} samples: the dataset is corrupt, convert again"
        )
    return index


def load_records(
    root: str | os.PathLike[str],
    index: np.ndarray,
    mmap: bool = False,
    manifest: Manifest | None = None,
    dir_fd: int | None = None,
) -> np.ndarray:
    """Load ``records.npy`` (``mmap``: map it read-only) from the dataset folder (``dir_fd``,
    or ``root``), check its bytes against ``manifest``'s checksum when given, and check that
    the samples' runs of records cover it exactly.

    Raises:
        FormatError: missing, a link, unreadable, damaged, wrong dtype, or runs that do not
            tile the table.
    """
    root = Path(root)
    path = root / RECORDS_NAME
    digest = manifest.digest(RECORDS_NAME, str(root)) if manifest else None
    records = _load_table(root, RECORDS_NAME, RECORD_DTYPE, "record table", mmap, digest, dir_fd)
    check_runs(str(path), index, records)
    return records


def encode_keys(keys: Iterable[str], block: int = 16384) -> Iterator[bytes]:
    """The bytes of ``keys.txt`` for ``keys`` (one key per line; backslash, line feed and
    carriage return escaped as ``\\\\``, ``\\n``, ``\\r``, so any name keeps its line), in
    pieces of ``block`` keys: a million keys never make one string."""
    keys = iter(keys)
    while piece := list(itertools.islice(keys, block)):
        yield "".join(escape_key(k) + "\n" for k in piece).encode("utf-8", "surrogateescape")


def decode_keys(data: bytes) -> list[str]:
    """The keys ``keys.txt``'s bytes hold (:func:`encode_keys` reversed)."""
    text = data.decode("utf-8", "surrogateescape")
    return [unescape_key(line) for line in text.split("\n")[:-1]]


def write_keys(root: str | os.PathLike[str], keys: Iterable[str]) -> str:
    """Write ``keys.txt`` (:func:`encode_keys`) durably and atomically; return its checksum."""
    path = Path(root) / KEYS_NAME
    _write_atomic(path, encode_keys(keys))
    fsync_dir(Path(root))
    return file_checksum(path)


def load_keys(
    root: str | os.PathLike[str], manifest: Manifest | None = None, dir_fd: int | None = None
) -> list[str]:
    """Read ``keys.txt`` back into a list of keys, checked against ``manifest``'s checksum
    when given (datasets use a lazy :class:`packer.core.keytable.KeyTable` instead: no ``str`` per
    key)."""
    root = Path(root)
    data, _ = read_checked(
        root, KEYS_NAME, manifest.digest(KEYS_NAME, str(root)) if manifest else None, False, dir_fd
    )
    return decode_keys(bytes(data))
