"""``open_dataset`` and ``open_video_dataset``: what a path or URL holds picks the dataset class.

Every keyword is checked against the class it goes to before anything is opened: a typo is a
:class:`~packer.errors.PackerError` naming the closest known keyword and all of them.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, overload

from packer.core.fields import kind_noun
from packer.core.manifest import MANIFEST_NAME, Manifest
from packer.errors import FormatError, PackerError
from packer.formats import FORMATS
from packer.read.datasets import _CLASSES, FolderDataset, ImageDataset
from packer.read.fields import FieldDataset
from packer.read.options import READ_OPTIONS, ReadOptions, check_keywords, keywords_of
from packer.read.store import open_packed
from packer.read.video_datasets import _CLASSES as VIDEO_CLASSES
from packer.read.video_datasets import FolderVideoDataset, VideoDataset
from packer.remote.local import file_path, is_file_url
from packer.remote.storage import is_url
from packer.source.detect import detect_kind, find_splits

__all__ = ["open_dataset", "open_video_dataset"]

Path_ = str | os.PathLike[str]


@overload
def open_dataset(
    path: Path_,
    split: str | None = None,
    *,
    kind: Literal["image"],
    readahead: bool | None = None,
    max_open_files: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache: bool | None = None,
    cache_dir: Path_ | None = None,
    cache_limit: int | str | None = None,
    **dataset_options: Any,
) -> ImageDataset: ...


@overload
def open_dataset(
    path: Path_,
    split: str | None = None,
    *,
    kind: Literal["video"],
    readahead: bool | None = None,
    max_open_files: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache: bool | None = None,
    cache_dir: Path_ | None = None,
    cache_limit: int | str | None = None,
    **dataset_options: Any,
) -> VideoDataset: ...


@overload
def open_dataset(
    path: Path_,
    split: str | None = None,
    *,
    kind: Literal["fields"],
    readahead: bool | None = None,
    max_open_files: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache: bool | None = None,
    cache_dir: Path_ | None = None,
    cache_limit: int | str | None = None,
    **dataset_options: Any,
) -> FieldDataset: ...


@overload
def open_dataset(
    path: Path_,
    split: str | None = None,
    *,
    kind: None = None,
    readahead: bool | None = None,
    max_open_files: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache: bool | None = None,
    cache_dir: Path_ | None = None,
    cache_limit: int | str | None = None,
    **dataset_options: Any,
) -> ImageDataset | VideoDataset | FieldDataset: ...


def open_dataset(
    path: Path_,
    split: str | None = None,
    *,
    kind: str | None = None,
    readahead: bool | None = None,
    max_open_files: int | None = None,
    storage_options: dict[str, Any] | None = None,
    cache: bool | None = None,
    cache_dir: Path_ | None = None,
    cache_limit: int | str | None = None,
    **dataset_options: Any,
) -> ImageDataset | VideoDataset | FieldDataset:
    """Open a packer output (any format and kind, read from its manifest) or a plain folder
    (``<class>/<image>``, ``<class>/<video>/<frame>``, or a split root such as ``imagenet/``
    with ``train/`` and ``val/``).

    Args:
        path: the output or folder, or the URL of an output (``s3://...``, ``https://...``,
            any fsspec protocol).
        split: the split to open (``"train"``, ``"val"``, ...) of an output or folder that has
            splits.
        kind: ``"image"``, ``"video"`` or ``"fields"`` to say what you expect (and get a precise static type:
            :class:`~packer.read.datasets.ImageDataset` or
            :class:`~packer.read.video_datasets.VideoDataset`; samples with fields:
            :class:`~packer.read.fields.FieldDataset`); ``None`` takes what the path holds
            (typed as any of the three).
        readahead, max_open_files, storage_options, cache, cache_dir, cache_limit: the read
            options of a packed output (:class:`~packer.read.options.ReadOptions`; the last
            four for a URL only: LMDB shards are read through the node's shard cache, which
            also caches NPY/HDF5 shards when one of them is given); ``check_records=True``
            checks every record of a local output against its xxh3 (a URL's always are).
        dataset_options: go to the dataset class: ``transform``, ``target_transform``,
            ``output``, ``on_error``, ``decoder``; for images ``batch_buffer`` (a folder:
            ``is_valid_file``, ``loader``); for clips ``num_frames``, ``sampling``, ``stride``,
            ``seed``.

    Raises:
        PackerError: the path is neither a packer output nor an image folder, a split is
            missing or unknown, or a keyword is not one the dataset takes.
        FormatError: the path holds another kind than ``kind``.
    """
    if kind not in (None, "image", "video", "fields"):
        raise PackerError(f"unknown kind {kind!r}; expected 'image', 'video' or 'fields'")
    read = ReadOptions(
        None, readahead, max_open_files, storage_options, cache, cache_dir, cache_limit
    )
    # before any request or file: a keyword no dataset of the kind takes is a typo
    kinds: list[type[Any]] = [*_CLASSES.values(), FolderDataset] if kind in (None, "image") else []
    kinds += [*VIDEO_CLASSES.values(), FolderVideoDataset] if kind in (None, "video") else []
    kinds += [FieldDataset] if kind in (None, "fields") else []
    known = [n for n in keywords_of(*kinds) if n != "root"]
    check_keywords(dataset_options, {*known, *READ_OPTIONS, "kind"}, "open_dataset")
    read = replace(read, check_records=bool(dataset_options.pop("check_records", False)))
    path = file_path(str(path)) if is_file_url(path) else path  # file:///x is the local /x
    if is_url(path):
        return _open_packed(str(path), split, kind, read, dataset_options)
    root = Path(path)
    if not root.exists():
        unfinished = root.with_name(root.name + ".partial")
        if root.suffix.lower() in FORMATS and unfinished.is_dir():
            raise PackerError(
                f"{str(root)!r} does not exist: {str(unfinished)!r} holds its unfinished "
                f"conversion or write. {_FINISH}"
            )
        raise PackerError(f"{str(root)!r} does not exist")
    if root.is_dir() and not (root / MANIFEST_NAME).is_file():
        _refuse_unfinished(root)
    if (root / MANIFEST_NAME).is_file():
        return _open_packed(root, split, kind, read, dataset_options)
    if root.suffix.lower() in FORMATS and root.is_dir():
        raise FormatError(
            f"{str(root)!r} has no {MANIFEST_NAME}: it is not a complete packer output"
        )
    if root.is_dir():
        splits = find_splits(root)
        if splits or split is not None:
            if split not in splits:
                raise PackerError(
                    f"{str(root)!r} holds splits {', '.join(splits) or '(none)'}: pass split="
                    + (f" one of them, not {split!r}" if split is not None else "")
                )
            root = root / split
        video = _expect(kind, detect_kind(root), root) == "video"
        return _make(FolderVideoDataset if video else FolderDataset, root, read, dataset_options)
    raise PackerError(f"{str(root)!r} is neither a packer output nor an image folder")


_FINISH = (
    "Finish it with the same packer convert (or packer pack) command and --resume, or remove "
    "it and start again"
)


def _refuse_unfinished(root: Path) -> None:
    """``DST.partial`` or a part ``DST.part-I`` opened as a dataset: say what it is (it would
    otherwise be read as an image folder, "no class folders")."""
    name = root.name
    if name.endswith(".partial") and Path(name[: -len(".partial")]).suffix.lower() in FORMATS:
        raise FormatError(
            f"{str(root)!r} is an unfinished conversion or write (no {MANIFEST_NAME} yet), not "
            f"a dataset. {_FINISH}"
        )
    stem, dot, number = name.rpartition(".part-")
    if dot and number.isdigit() and Path(stem).suffix.lower() in FORMATS:
        raise FormatError(
            f"{str(root)!r} is part {number} of {stem!r} (--part I/N), not a dataset: when "
            f"every part is done, join them with packer merge {str(root.with_name(stem))}"
        )


def open_video_dataset(path: Path_, split: str | None = None, **options: Any) -> VideoDataset:
    """Open a packer video output (local or at a URL; format from its manifest) or a plain
    frame-folder tree: :func:`open_dataset` with ``kind="video"``.

    Keyword arguments are :func:`open_dataset`'s (``num_frames``, ``sampling``, ``output``,
    the read options, ...).
    """
    return open_dataset(path, split, kind="video", **options)


def _make(cls: type[Any], root: str | Path, read: ReadOptions, options: dict[str, Any]) -> Any:
    """``cls(root, ...)`` once every keyword is one ``cls`` takes."""
    takes = [n for n in keywords_of(cls) if n not in ("root", "split")]
    check_keywords(options, takes, cls.__name__)
    given = read.given()
    if given and not set(READ_OPTIONS) & set(takes):
        raise PackerError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to a packed "
            f"dataset, not to the plain folder {str(root)!r}"
        )
    return cls(root, **options, **given)


def _expect(kind: str | None, found: str, root: Path) -> str:
    """``found`` ("image", "video", "fields"), or a FormatError when the caller expected
    another."""
    if kind is not None and kind != found:
        raise FormatError(
            f"{str(root)!r} holds {kind_noun(found)}, not {kind_noun(kind)}: open it with "
            f"kind={found!r} (or without kind=)"
        )
    return found


def _open_packed(
    root: str | Path,
    split: str | None,
    kind: str | None,
    read: ReadOptions,
    options: dict[str, Any],
) -> ImageDataset | VideoDataset | FieldDataset:
    """The dataset class of the packed output at ``root`` (a path or URL), chosen from its
    manifest as soon as the one open (:func:`~packer.read.store.open_packed`) has read it, and
    handed that open's :class:`~packer.read.store.Packed`: ``packer.json`` read once."""
    chosen: list[type[Any]] = []

    def choose(manifest: Manifest, where: str) -> None:
        cls = _class_of(kind, manifest, Path(where))
        takes = [n for n in keywords_of(cls) if n not in ("root", "split", *READ_OPTIONS)]
        check_keywords(options, takes, cls.__name__)  # before any table is read
        chosen.append(cls)

    packed = open_packed(root, options=replace(read, split=split), check=choose)
    dataset: ImageDataset | VideoDataset | FieldDataset = chosen[0](packed, **options)
    return dataset


def _class_of(kind: str | None, manifest: Any, root: Path) -> type[Any]:
    """The dataset class of a packed output: by its kind and format."""
    found = _expect(kind, manifest.kind, root)
    if found == "fields":
        return FieldDataset
    return (VIDEO_CLASSES if found == "video" else _CLASSES)[manifest.format]
