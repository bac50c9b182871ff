"""Datasets that ship as splits: ``imagenet/train/<class>/...``, ``imagenet/val/<class>/...``.

A source whose top-level folders are all split names converts into one output holding every
split, each a complete packer output of its own, with one class index shared by all (the
training split's)::

    out.lmdb/
      packer.json    kind "splits": the shared classes, options["splits"] = {name: samples}
      train/         a complete packer output (its own packer.json, tables, shards)
      val/           the same; its labels index the training split's classes

``packer.open_dataset("out.lmdb", split="val")`` (or ``LMDBDataset(..., split="val")``) opens one;
``out.lmdb/val`` is also readable on its own.

A conversion first plans every split (:func:`plan_splits`: each split's shape, labels file and
class index checked and its source scanned, no byte of data read), so a problem in ``val/`` is
reported before ``train/`` is converted; then it converts the splits one after another into
``DST.partial/<split>`` with the ordinary pipeline, so ``--resume`` continues inside the split it
stopped in. A split is either class folders or a flat folder of images with a labels file
(ImageNet's ``val/`` + ``LOC_val_solution.csv``); every split's labels index the classes of the
training split's folders (or the index given with ``--classes``/``--classes-from``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.core.manifest import MANIFEST_NAME, Manifest, load_manifest, write_manifest
from packer.errors import DestinationError, PackerError, SourceError
from packer.source.detect import detect, find_splits
from packer.source.images import is_image_name
from packer.write.destination import DestinationLock, check_destination, partial_path, publish
from packer.write.resume import Progress, changed_inputs, unstarted

__all__ = [
    "SplitPlan",
    "SplitsBuild",
    "build_splits",
    "describe_splits",
    "plan_splits",
    "prepared_split",
]


@dataclass
class SplitPlan:
    """A checked root of splits: the shared class index, where it came from, and each split's
    scanned source (a :class:`packer.write.pipeline.Prepared`) with the summary line of its index."""

    splits: list[str]
    classes: list[str]
    index_split: str
    prepared: dict[str, Any]
    index_of: dict[str, str]

    def describe(self) -> str:
        """``train: 1000 class folders; val: labels file LOC_val_solution.csv, classes from
        train``."""
        return "; ".join(f"{s}: {self.index_of[s]}" for s in self.splits)


def prepared_split(
    split: str, prepare: Callable[[str], Any], strict: bool, problems: list[str]
) -> Any:
    """Split ``split``'s source scanned by ``prepare(split)``, or None once its
    :class:`~packer.errors.SourceError` is added to ``problems``; with ``strict``, its first
    skipped input is a problem too (the split is still returned)."""
    try:
        prepared = prepare(split)
    except SourceError as exc:
        problems.append(f"split {split!r}: {exc}")
        return None
    if strict and prepared.source.skipped:
        first = prepared.source.skipped[0]
        problems.append(f"split {split!r}: {first.path}: {first.reason} (--strict)")
    return prepared


def _shape(folder: Path) -> tuple[list[str], int]:
    """The class folders of a split and the number of images directly inside it."""
    try:
        with os.scandir(folder) as it:
            entries = [e for e in it if not e.name.startswith(".")]
    except OSError as exc:
        raise SourceError(f"split {str(folder)!r} cannot be listed: {exc.strerror}") from exc
    folders = sorted(e.name for e in entries if e.is_dir())
    return folders, sum(1 for e in entries if is_image_name(e.name) and e.is_file())


def _assign_labels(
    labels: Any, src: Path, found: list[str], wanted: list[str], flat: list[str]
) -> dict[str, str]:
    """``{split: labels file}`` from ``--labels FILE`` (the one flat split) or ``SPLIT=FILE``."""
    if labels is None:
        return {}
    given = dict(labels) if isinstance(labels, Mapping) else {"": labels}
    out: dict[str, str] = {}
    for split, file in given.items():
        if split == "":
            if len(flat) != 1:
                raise SourceError(
                    f"--labels {os.fspath(file)!r}: "
                    + (
                        f"splits {', '.join(flat)} of {str(src)!r} are all flat; name the split "
                        f"of each file: --labels {flat[0]}=FILE --labels {flat[1]}=FILE"
                        if flat
                        else f"no split of {str(src)!r} is flat (images directly, no class "
                        f"folders): {', '.join(wanted)} hold class folders, which label their "
                        "images; drop --labels"
                    )
                )
            split = flat[0]
        elif split not in found:
            raise SourceError(
                f"--labels {split}={os.fspath(file)}: {str(src)!r} has no split {split!r}; it "
                f"has {', '.join(found)}"
            )
        elif split not in wanted:
            raise SourceError(
                f"--labels {split}={os.fspath(file)}: split {split!r} is not converted (--split "
                f"{' --split '.join(wanted)}); add --split {split} or drop its labels"
            )
        elif split not in flat:
            raise SourceError(
                f"--labels {split}={os.fspath(file)}: split {split!r} holds class folders, which "
                "label its images; --labels applies to a flat split only"
            )
        out[split] = os.fspath(file)
    return out


def _check_shape(src: Path, split: str, folders: list[str], images: int, labelled: bool) -> None:
    """Refuse a split that is empty, flat without labels, or a tree of videos."""
    where = str(src / split)
    if labelled:  # a flat split: _assign_labels gives labels to no other
        return
    if not folders and images:
        raise SourceError(
            f"{where!r} holds {images} image(s) directly and no class "
            f"folders: pass its labels file with --labels FILE (ImageNet: LOC_val_solution.csv) "
            f"or --labels {split}=FILE"
        )
    if not folders:
        raise SourceError(
            f"{where!r} is empty: no class folders and no images; remove it, "
            f"or convert the other splits with --split NAME"
        )
    try:
        kind = detect(src / split, folders).kind
    except SourceError:  # could be either: a split is converted as images, as it always was
        return
    if kind == "video":
        raise SourceError(
            f"{where!r} looks like a tree of videos; a root of splits is "
            f"converted as images only so far: convert each split folder on its own, e.g. "
            f"packer convert {where} {split}.npy --kind video"
        )


def plan_splits(
    src: Path,
    wanted: list[str],
    prepare_split: Callable[[Path, list[str], str | None, str], Any],
    labels: Any = None,
    classes: list[str] | None = None,
    strict: bool = False,
    found: list[str] | None = None,
) -> SplitPlan:
    """Check every split of ``src`` to convert and scan it, before anything is written.

    ``prepare_split(folder, classes, labels_file, index_from)`` scans one split (it is
    :func:`packer.write.prepare.prepare` with the conversion's options). The class index is
    ``classes`` if given, else the class folders of the training split (``train``, or the first
    split), converted or not.

    ``found`` is the splits of ``src`` when the caller listed them already.

    Raises:
        SourceError: every problem found, one per split: an empty split, a flat split without
            labels, labels for no flat split, labels or class folders unknown to the index.
    """
    found = find_splits(src) if found is None else found
    index_split = "train" if "train" in found else found[0]
    shapes = {s: _shape(src / s) for s in dict.fromkeys([*wanted, index_split])}
    flat = [s for s in wanted if not shapes[s][0] and shapes[s][1]]
    assigned = _assign_labels(labels, src, found, wanted, flat)
    if classes is None:
        classes = shapes[index_split][0]
        if not classes:
            raise SourceError(
                f"the training split {str(src / index_split)!r} has no class folders to take "
                "the class index from: pin it with --classes FILE or --classes-from OUTPUT"
            )
        index_from, own = f"classes from {index_split}", f"{len(classes)} class folders"
    else:
        index_from = own = f"the given class index ({len(classes)} classes)"
    plan = SplitPlan(wanted, list(classes), index_split, {}, {})
    problems: list[str] = []

    def scan_split(split: str) -> Any:
        folders, images = shapes[split]
        file = assigned.get(split)
        _check_shape(src, split, folders, images, file is not None)
        return prepare_split(src / split, plan.classes, file, index_from)

    for split in wanted:
        prepared = prepared_split(split, scan_split, strict, problems)
        if prepared is None:
            continue
        plan.prepared[split] = prepared
        folders, file = shapes[split][0], assigned.get(split)
        if file is not None:
            plan.index_of[split] = f"labels file {os.path.basename(file)}, {index_from}"
        elif split == index_split:
            plan.index_of[split] = own
        else:
            plan.index_of[split] = f"{len(folders)} class folders, {index_from}"
    if problems:
        raise SourceError("\n".join(problems))
    return plan


@dataclass
class SplitsBuild:
    """A root of splits being built in ``DST.partial``: :meth:`todo` names the splits left to
    convert (loading the manifests of those a resumed run finished); the caller converts each
    and hands its manifest to :meth:`done`."""

    partial: Path
    splits: list[str]
    resume: bool
    results: dict[str, Manifest] = field(default_factory=dict)
    manifest: Manifest | None = None  # the top-level one, once written

    def todo(self) -> Iterator[tuple[str, Path, bool]]:
        """``(split, its folder, whether to resume it)`` for each split not yet converted."""
        for split in self.splits:
            part = self.partial / split
            if (part / MANIFEST_NAME).is_file():
                self.results[split] = load_manifest(part)
                continue
            yield split, part, self.resume and partial_path(part).is_dir()

    def done(self, split: str, manifest: Manifest) -> None:
        self.results[split] = manifest


@contextlib.contextmanager
def build_splits(
    src: Path, dst: Path, plan: SplitPlan, fp: dict[str, Any], overwrite: bool, resume: bool
) -> Iterator[SplitsBuild]:
    """Under ``dst``'s lock, start (or resume, if ``fp`` is unchanged) ``DST.partial`` for the
    splits of ``plan`` (checked by :func:`plan_splits`) and yield the build; once every split
    is converted, write the top-level manifest and publish."""
    splits = plan.splits
    partial = partial_path(dst)
    with DestinationLock(dst):
        if resume and not overwrite and not partial.exists() and dst.is_dir():
            done = _same_build(dst, fp, plan)
            if done is not None:  # published already (a kill after it): nothing to do
                build = SplitsBuild(dst, splits, resume)
                yield build
                build.manifest = done
                return
        check_destination(dst, overwrite, src, resume)
        if resume and partial.is_dir() and not unstarted(partial):  # else started afresh
            _resume(partial, fp, plan)
        else:
            if partial.exists():
                shutil.rmtree(partial)
            partial.mkdir()
            Progress(partial).start(fp)
        build = SplitsBuild(partial, splits, resume)
        yield build
        build.manifest = _manifest(src, plan, build.results)
        write_manifest(partial, build.manifest)  # before the progress goes:
        Progress(partial).remove()  # a kill between the two leaves a resumable .partial
        publish(partial, dst)


def _same_build(folder: Path, fp: dict[str, Any], plan: SplitPlan) -> Manifest | None:
    """The top manifest at ``folder`` if it is this conversion's (root, splits, format), every
    split in it is finished and no input of a split was modified after that split's manifest
    was written (the rule a single output's finished conversion follows); else None."""
    try:
        top = load_manifest(folder)
    except PackerError:
        return None
    found = (top.kind, top.source.get("root"), top.source.get("splits"), top.format)
    wanted = ("splits", fp["root"], fp["splits"], fp["options"].get("format"))
    if found != wanted:
        return None
    for split in fp["splits"]:
        try:
            written = (folder / split / MANIFEST_NAME).stat().st_mtime_ns
        except OSError:
            return None  # a split not finished
        if changed_inputs(plan.prepared[split].source, written):
            return None
    return top


def _resume(partial: Path, fp: dict[str, Any], plan: SplitPlan) -> None:
    """Continue ``DST.partial`` from its progress; or, when a kill came after the top manifest
    replaced the progress (every split finished, not yet published), from its finished splits:
    the top manifest is written again, once it shows this conversion's root, splits and
    format.

    Raises:
        DestinationError: the finished build is of another root, other splits or format.
        PackerError: nothing resumable (no progress, no manifest).
    """
    if Progress(partial).fingerprint() is None and (partial / MANIFEST_NAME).is_file():
        if _same_build(partial, fp, plan) is None:
            raise DestinationError(
                f"{str(partial)!r} holds a finished conversion that was not published, of "
                "another root, other splits, another format or inputs modified since; pass "
                "--overwrite to start over"
            )
        Progress(partial).start(fp)  # before the manifest goes: a kill leaves progress
        (partial / MANIFEST_NAME).unlink()
        return
    Progress(partial).resume(fp)


def _manifest(src: Path, plan: SplitPlan, results: dict[str, Manifest]) -> Manifest:
    """The top-level manifest of a root of splits: the shared classes, each split's count."""
    counts = {s: results[s].num_samples for s in plan.splits}
    first = results[plan.splits[0]]
    return Manifest(
        format=first.format,
        kind="splits",
        num_samples=sum(counts.values()),
        classes=plan.classes,
        shards=[],
        source={"root": str(src.resolve()), "splits": plan.splits},
        options={
            "splits": counts,
            "class_index_from": plan.index_split,
            "class_index": plan.index_of,
            "kind": first.kind,
        },
    )


def describe_splits(root: Path | str, manifest: Manifest | None = None) -> str:
    """``packer inspect`` lines for a split output (a folder, or a URL with its manifest)."""
    manifest = load_manifest(Path(root)) if manifest is None else manifest
    counts = manifest.opts.splits
    lines = [
        f"{root}: packer {manifest.format} dataset with {len(counts)} splits, "
        f"{len(manifest.classes)} classes (index from {manifest.opts.class_index_from!r})",
    ]
    lines += [f"  {name}: {n} samples ({root}/{name})" for name, n in counts.items()]
    index_of = manifest.opts.class_index
    if index_of:
        lines.append("  class index: " + "; ".join(f"{s}: {w}" for s, w in index_of.items()))
    return "\n".join(lines)
