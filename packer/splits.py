"""Datasets that ship as splits: ``imagenet/train/<class>/...``, ``imagenet/val/<class>/...``.

A source whose top-level folders are all split names converts into one output holding every
split, each a complete packer output of its own, with one class index shared by all (the
training split's)::

    out.lmdb/
      packer.json    kind "splits": the shared classes, options["splits"] = {name: samples}
      train/         a complete packer output (its own packer.json, tables, shards)
      val/           the same; its labels index the training split's classes

``packer.open_dataset("out.lmdb", split="val")`` (or ``LMDBDataset(..., split="val")``) opens one;
``out.lmdb/val`` is also readable on its own. Conversion converts the splits one after another
into ``DST.partial/<split>`` with the ordinary pipeline, so ``--resume`` continues inside the split
it stopped in.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from packer.contained import check_relative, open_beneath, open_folder
from packer.destination import DestinationLock, check_destination, partial_path, publish
from packer.errors import FormatError, SourceError
from packer.manifest import MANIFEST_NAME, Manifest, load_manifest, write_manifest
from packer.resume import Progress

__all__ = ["SPLIT_NAMES", "convert_splits", "describe_splits", "find_splits", "split_root"]

SPLIT_NAMES = ("train", "val", "validation", "test")


def _folders(root: Path) -> list[str]:
    try:
        return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as exc:
        raise SourceError(f"source {str(root)!r} cannot be listed: {exc.strerror}") from exc


def find_splits(root: str | os.PathLike[str]) -> list[str]:
    """The split folders of ``root`` in order (train first), or [] if it is not a split root.

    Raises:
        SourceError: split folders side by side with other folders (which is which is unclear).
    """
    path = Path(root)
    if not path.is_dir():
        return []
    folders = _folders(path)
    named = [f for f in folders if f.lower() in SPLIT_NAMES]
    if not named:
        return []
    others = [f for f in folders if f not in named]
    if others:
        raise SourceError(
            f"{str(path)!r} holds split folders ({', '.join(named)}) next to other folders "
            f"({', '.join(others[:3])}{' ...' if len(others) > 3 else ''}): convert one split "
            f"with --split {named[0]}, or move the others out"
        )
    return sorted(named, key=lambda f: (SPLIT_NAMES.index(f.lower()), f))


def split_root(root: Path, split: str | None) -> Path:
    """The folder of ``split`` in the packed output ``root`` (``root`` itself if it has no
    splits and none is asked).

    Raises:
        FormatError: a split output opened without ``split``, an unknown split, or ``split``
            asked of an output without splits.
    """
    manifest = load_manifest(root)
    names = list(manifest.options.get("splits", {})) if manifest.kind == "splits" else []
    if not names:
        if split is not None:
            raise FormatError(f"{str(root)!r} has no splits; open it without split=")
        return root
    if split is None:
        raise FormatError(
            f"{str(root)!r} holds splits {', '.join(names)}: pass split= (e.g. split={names[0]!r})"
        )
    if split not in names:
        raise FormatError(f"{str(root)!r} has no split {split!r}; it has {', '.join(names)}")
    if "/" in check_relative(split, "split name"):
        raise FormatError(f"split name {split!r} of {str(root)!r} is not a plain folder name")
    folder = open_folder(root)
    try:  # a real folder inside the output, never a link to another dataset
        os.close(open_beneath(folder, split, root, folder=True, what="split"))
    finally:
        os.close(folder)
    return root / split


def _fingerprint(src: Path, splits: list[str], options: dict[str, Any]) -> dict[str, Any]:
    kept = ["format", "shard_size", "check", "strict", "max_file_size", "max_pixels"]
    kept += ["quality", "max_side", "short_side", "reencode", "size", "fps", "skip_bad_frames"]
    return {
        "root": str(src.resolve()),
        "splits": splits,
        "options": {k: options.get(k) for k in kept},
    }


def convert_splits(
    src: Path, dst: Path, splits: list[str], convert: Any, **options: Any
) -> tuple[Manifest, dict[str, Any]]:
    """Convert each split of ``src`` into ``dst/<split>`` with one class index; return the
    top-level manifest and each split's result. ``convert`` is :func:`packer.convert.convert`."""
    overwrite, resume = options.pop("overwrite", False), options.pop("resume", False)
    check_destination(dst, overwrite, src, resume)
    train = "train" if "train" in splits else splits[0]
    classes = _folders(src / train)
    if not classes:
        raise SourceError(f"the training split {str(src / train)!r} has no class folders")
    partial = partial_path(dst)
    fp = _fingerprint(src, splits, options)
    results: dict[str, Any] = {}
    with DestinationLock(dst):
        check_destination(dst, overwrite, src, resume)
        fresh = not (resume and partial.is_dir())
        if not fresh:
            Progress(partial).resume(fp)
        else:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir()
            Progress(partial).start(fp)
        try:
            for split in splits:
                part = partial / split
                if (part / MANIFEST_NAME).is_file():
                    results[split] = load_manifest(part)
                    continue
                again = resume and partial_path(part).is_dir()
                results[split] = convert(
                    src / split, part, classes=classes, resume=again, **options
                ).manifest
        except SourceError:
            if fresh and not results:  # refused before any work: leave nothing to --resume
                shutil.rmtree(partial, ignore_errors=True)
            raise
        counts = {s: m.num_samples for s, m in results.items()}
        first = results[splits[0]]
        manifest = Manifest(
            format=first.format,
            kind="splits",
            num_samples=sum(counts.values()),
            classes=classes,
            shards=[],
            source={"root": str(src.resolve()), "splits": splits},
            options={"splits": counts, "class_index_from": train, "kind": first.kind},
        )
        Progress(partial).remove()
        write_manifest(partial, manifest)
        publish(partial, dst)
    return manifest, results


def describe_splits(root: Path) -> str:
    """``packer inspect`` lines for a split output."""
    manifest = load_manifest(root)
    counts = manifest.options.get("splits", {})
    lines = [
        f"{root}: packer {manifest.format} dataset with {len(counts)} splits, "
        f"{len(manifest.classes)} classes (index from {manifest.options.get('class_index_from')!r})",
    ]
    lines += [f"  {name}: {n} samples ({root / name})" for name, n in counts.items()]
    return "\n".join(lines)
