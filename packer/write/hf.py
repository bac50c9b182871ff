"""The Hugging Face part of a conversion: scan a ``datasets`` source, load its rows, plan splits.

:func:`prepare_hf` scans one dataset (or split) with :func:`packer.source.hf_tables.scan_hf`
and returns the loader the pipeline runs: an image table's sample is checked as a class tree's
image is (``--check``, resized or transcoded likewise), a richer table's sample as any sample
with fields (:func:`packer.write.fields.load_fields`). A sample's bytes come from where the scan
found them: a byte range of an Arrow file (``pread``), a file beside the table (read beneath
its folder, no link leaving it unless ``follow_links``), or a Parquet row group, decoded once
per process into :data:`ROW_GROUPS` — which holds the last :data:`HELD_GROUPS` of them, so a
conversion's memory is a row group per worker whatever the file's size. :func:`plan_hf_splits`
plans a ``DatasetDict`` (or a folder of Parquet files named by split) as a root of splits with
one class index, the training split's ClassLabel names.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from packer.decode.pixels import to_pixels
from packer.decode.resize import Resize
from packer.errors import InputFileError, PackerError, SourceError
from packer.remote.fetch import fetch_object, source_folder
from packer.remote.storage import RemoteFolder
from packer.source.hf_features import HFSource, hf_source
from packer.source.hf_tables import RowPart, scan_hf
from packer.source.links import read_source_file
from packer.source.samples import Part
from packer.source.tars import expand_braces, unique_names
from packer.write.fields import prepare_fields, read_part
from packer.write.loading import Loaded, stored_image
from packer.write.options import ConvertOptions, Limits, given
from packer.write.pipeline import Prepared
from packer.write.splits import SplitPlan, prepared_split

__all__ = [
    "HELD_GROUPS",
    "ROW_GROUPS",
    "RowGroups",
    "fetch_parquet",
    "plan_hf_splits",
    "prepare_hf",
    "prepare_hf_source",
]

HELD_GROUPS = 2  # row groups a process keeps decoded (two: a batch of samples may straddle)


class RowGroups:
    """The per-process cache of decoded Parquet row groups (one column each), by file, group and
    column; ``reads`` counts the row groups decoded, ``most`` the most held at once."""

    def __init__(self, held: int = HELD_GROUPS) -> None:
        self.held = held
        self.reads = 0
        self.most = 0
        self._lock = threading.Lock()
        self._groups: OrderedDict[tuple[str, int, str], Any] = OrderedDict()

    def value(self, part: RowPart) -> bytes:
        """The bytes of ``part``'s row.

        Raises:
            InputFileError: the file cannot be read any more, or its row is not what was scanned.
        """
        key = (part.path, part.group, part.column)
        with self._lock:  # threads loading one row group decode it once
            column = self._groups.get(key)
            if column is None:
                column = self._read(part)
                self._groups[key] = column
                self.reads += 1
                while len(self._groups) > self.held:
                    self._groups.popitem(last=False)
                self.most = max(self.most, len(self._groups))
            else:
                self._groups.move_to_end(key)
        if part.row >= len(column) or not column[part.row].is_valid:
            raise InputFileError("changed during the conversion (its row is gone or null)")
        return column[part.row].as_py()

    def clear(self) -> None:
        with self._lock:
            self._groups.clear()

    @staticmethod
    def _read(part: RowPart) -> Any:
        import pyarrow.parquet as pq

        try:
            table = pq.ParquetFile(part.path).read_row_group(part.group, columns=[part.column])
            return table.column(0).combine_chunks().field("bytes")
        except Exception as exc:  # ArrowInvalid / OSError: the file changed or went
            raise InputFileError(f"row group {part.group} cannot be read: {exc}") from exc


ROW_GROUPS = RowGroups()


def part_bytes(part: Part, root: str, follow_links: bool, max_bytes: int) -> bytes:
    """The bytes of one part of a Hugging Face row (checked to be the scanned size).

    Raises:
        InputFileError: it cannot be read, is over ``max_bytes`` or changed since the scan.
    """
    if part.size > max_bytes:
        raise InputFileError(f"{part.size / 1e6:.1f} MB, over the limit (--max-file-size)")
    if isinstance(part, RowPart):
        data = ROW_GROUPS.value(part)
    elif part.data is None and part.offset < 0:  # an image file beside the table
        data = read_source_file(root, part.path, follow_links, max_bytes)
    else:
        return read_part(part, max_bytes)
    if len(data) != part.size:
        raise InputFileError(
            f"changed during the conversion ({part.size} bytes scanned, {len(data)} read); "
            "convert again once it is complete"
        )
    return data


def load_hf_image(
    sample: Any,
    root: str,
    follow_links: bool = False,
    check: str = "fast",
    transcode: Callable[[bytes], bytes] | None = None,
    resize: Resize | None = None,
    limits: Limits | None = None,
) -> Loaded:
    """Read, check, resize and transcode the image of one row into one record."""
    limits = limits or Limits()
    try:
        data = part_bytes(sample.part, root, follow_links, limits.max_file_size)
    except InputFileError as exc:
        return Loaded(None, str(exc))
    return stored_image(data, check, transcode, limits.max_pixels, resize)


def load_hf_fields(
    sample: Any,
    loader: Callable[[Any], Loaded],
    root: str,
    follow_links: bool = False,
    max_file_size: int = 0,
) -> Loaded:
    """``loader(sample)`` once every part of the row is read into memory."""
    parts = []
    for part in sample.parts:
        if part.data is None:
            try:
                data = part_bytes(part, root, follow_links, max_file_size)
            except InputFileError as exc:
                return Loaded(None, f"field {part.field!r}: {exc}")
            part = Part(part.field, part.path, len(data), data=data)
        parts.append(part)
    return loader(dataclasses.replace(sample, parts=tuple(parts)))


def _image_loader(fmt: ModuleType, options: ConvertOptions) -> Any:
    """The image loader's options and what the manifest records of them (as for a class tree)."""
    check, size, resize = options.check, options.size, options.resize
    video_only = sorted(given(options.video))
    if video_only:
        raise PackerError(f"{', '.join(video_only)} only apply to video sources")
    recorded: dict[str, Any] = {"check": check, **dataclasses.asdict(options.limits)}
    transcode = fmt.TRANSCODE
    if resize.active:
        recorded["resize"] = resize.recorded()
    if size is not None:
        if fmt.NAME != "npy" or resize.active or not 1 <= size <= 4096:
            raise PackerError(
                f"--size {size!r}: decoded size×size pixels (1..4096) need a .npy destination "
                "and no --short-side/--max-side/--quality/--reencode"
            )
        transcode = functools.partial(to_pixels, size=size)
        recorded["pixels"] = [size, size, 3]
    cpu_bound = transcode is not None or resize.active or check != "fast"
    kwargs = {
        "check": check,
        "transcode": transcode,
        "resize": resize if resize.active else None,
        "limits": options.limits,
    }
    return kwargs, recorded, cpu_bound


def prepare_hf(
    files: list[str],
    features: dict[str, Any] | None,
    fmt: ModuleType,
    options: ConvertOptions,
    classes: list[str] | None = None,
) -> Prepared:
    """The conversion's part for one Hugging Face dataset (or split) made of ``files``.

    Raises:
        PackerError: the source cannot be scanned, or an option it cannot honour.
    """
    required, follow_links = options.fields.require, options.fields.follow_links
    scan = scan_hf(files, features, classes, list(required))
    root = scan.root
    if scan.kind == "image":
        if required:
            raise PackerError("--require applies to samples with fields; this table is images")
        kwargs, recorded, cpu_bound = _image_loader(fmt, options)
        recorded["source_kind"] = "hf"
        loader = functools.partial(load_hf_image, root=root, follow_links=follow_links, **kwargs)
        prepared = Prepared(scan, loader, cpu_bound, recorded, "img")
    else:
        prepared = prepare_fields(scan, fmt, options)  # type: ignore[arg-type]
        loader = functools.partial(
            load_hf_fields,
            loader=prepared.loader,
            root=root,
            follow_links=follow_links,
            max_file_size=options.limits.max_file_size,
        )
        prepared = dataclasses.replace(prepared, loader=loader)
    if follow_links:
        prepared = dataclasses.replace(prepared, options={**prepared.options, "follow_links": True})
    return prepared


def plan_hf_splits(
    hf: HFSource,
    wanted: list[str],
    prepare_one: Callable[..., Prepared],
    classes: list[str] | None,
    strict: bool,
) -> SplitPlan:
    """A DatasetDict (or Parquet files named by split) as a root of splits: one class index —
    ``classes`` if given, else the training split's ClassLabel names — every split scanned
    against it, each problem reported before anything is written.

    Raises:
        SourceError: every split's problem, one per split.
    """
    index_split = "train" if "train" in hf.files else hf.splits[0]
    if classes is None:
        first = prepare_one(hf.files[index_split], hf.features.get(index_split), classes=None)
        classes = list(first.source.classes)
        index_from = f"ClassLabel names of {index_split}"
    else:
        index_from = f"the given class index ({len(classes)} classes)"
    plan = SplitPlan(list(wanted), classes, index_split, {}, {})
    problems: list[str] = []

    def scan_split(split: str) -> Prepared:
        return prepare_one(hf.files[split], hf.features.get(split), classes=classes)

    for split in wanted:
        prepared = prepared_split(split, scan_split, strict, problems)
        if prepared is None:
            continue
        if prepared.source.kind != "image":
            raise SourceError(
                f"split {split!r} of {str(hf.root)!r} holds samples with fields, not images and "
                "a ClassLabel: a root of splits holds images only so far; convert each split on "
                f"its own (packer convert {hf.files[split][0]} {split}.lmdb)"
            )
        plan.prepared[split] = prepared
        plan.index_of[split] = f"{len(hf.files[split])} file(s), {index_from}"
    if problems:
        good = [s for s in wanted if s in plan.prepared]
        hint = f"; convert the others alone with --split {' --split '.join(good)}" if good else ""
        raise SourceError("; ".join(problems) + hint)
    return plan


def prepare_hf_source(
    prepare_one: Callable[..., Prepared],
    kind: str,
    src: Path,
    fmt: ModuleType,
    options: ConvertOptions,
    classes: list[str] | None,
    labels: Any,
) -> Prepared:
    """:func:`packer.write.prepare.prepare`'s part for a single Hugging Face dataset at
    ``src`` (same arguments): ``prepare_one(files, features, classes=...)`` scans it.

    Raises:
        SourceError: ``src`` is no Hugging Face source, or a labels file is given for one.
    """
    hf = hf_source(src)
    if hf is None:
        raise SourceError(
            f"{str(src)!r} is not a Hugging Face dataset (a .parquet or .arrow file of datasets, "
            "a save_to_disk or DatasetDict folder, a folder of Parquet files)"
        )
    if labels is not None:
        raise SourceError(f"--labels: {str(src)!r} labels its rows itself (its ClassLabel)")
    files = [f for split in hf.files.values() for f in split]
    return prepare_one(files, next(iter(hf.features.values()), None), classes=classes)


def fetch_parquet(url: str, storage_options: dict[str, Any] | None = None) -> Path | None:
    """The Parquet files ``url`` names (one, or a brace pattern of them) fetched into a local
    folder as tar shards are (:mod:`packer.remote.fetch`: kept while size, tag and digest match),
    each under its own name (the split names stay); None when ``url`` names no Parquet file.

    Raises:
        SourceError: two files of one name, or a file that does not exist.
        PackerError: the store cannot be reached (after retries).
    """
    urls = unique_names(expand_braces(url))
    if not all(u.lower().endswith(".parquet") for u in urls):
        return None
    names = [u.rpartition("/")[2] for u in urls]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise SourceError(f"{url!r} names two Parquet files called {twice!r}; name each once")
    target = source_folder(url)
    target.mkdir(parents=True, exist_ok=True)
    by_folder: dict[str, list[str]] = {}
    for u in urls:
        parent, _, name = u.rpartition("/")
        by_folder.setdefault(parent, []).append(name)
    for parent, files in by_folder.items():
        remote = RemoteFolder(parent, storage_options)
        sizes = remote.sizes(files)
        missing = [n for n in files if n not in sizes]
        if missing:
            raise SourceError(f"{parent + '/' + missing[0]!r} does not exist (from {url!r})")
        for name in files:
            fetch_object(remote, name, sizes[name], target / name)
    return target
