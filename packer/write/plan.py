"""One conversion, planned: every argument validated, the source scanned, nothing written yet.

:func:`plan_conversion` turns :func:`packer.write.convert.convert`'s arguments into one immutable
:class:`ConversionPlan`, checking them in the order a user meets them (format, workers, sizes,
splits, destination, kind, the kind's options, the scan). Everything below it takes what it
needs from the plan: the pipeline's :class:`packer.write.pipeline.Job` (:meth:`ConversionPlan.job`), the
options the manifest records (:attr:`ConversionPlan.options`), a root of splits' per-split plans
(:meth:`ConversionPlan.for_split`). An option goes from the CLI down to the writer through this
one object; nothing climbs back up for it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from packer.core.cpus import available_cpus
from packer.errors import DestinationError, InputFileError, PackerError, SourceError
from packer.formats import by_name, default_layout, format_for
from packer.remote.fetch import fetch_tars
from packer.remote.storage import is_url
from packer.source.detect import detect, detect_fields, find_splits
from packer.source.hf_features import hf_source
from packer.source.images import class_dirs
from packer.source.labels import Labels, one_labels_file
from packer.write.destination import check_destination, check_reach, partial_path
from packer.write.hf import fetch_parquet, plan_hf_splits, prepare_hf, prepare_hf_source
from packer.write.options import DEFAULT_SHARD_SIZE, ConvertOptions, Limits, options_of
from packer.write.pipeline import Job, Prepared
from packer.write.prepare import prepare, prepare_split
from packer.write.resume import sample_folders
from packer.write.splits import SplitPlan, plan_splits
from packer.write.tasks import check_part, part_path

__all__ = ["DEFAULT_SHARD_SIZE", "ConversionPlan", "Limits", "plan_conversion"]

# The options a root of splits' progress is fingerprinted by (each split adds its own).
_SPLITS_FINGERPRINTED = [
    *("format", "shard_size", "check", "strict", "max_file_size", "max_pixels"),
    *("quality", "max_side", "short_side", "reencode", "size", "fps", "skip_bad_frames"),
]


@dataclass(frozen=True)
class ConversionPlan:
    """Everything one conversion is, validated: what to read, what to write, how.

    ``prepared`` is the scanned source and its loader (a single folder); ``splits`` the checked
    root of splits instead (then ``kind`` is ``"splits"`` and ``layout`` is ``""``). ``dst`` is
    where the output is published (``DST.part-I`` for a part). ``settings`` are the options it
    was planned from (:class:`packer.write.options.ConvertOptions`), as given; the plan holds
    what it resolved of them (``format``, ``kind``, ``workers``, ``resume`` for a split).
    """

    src: Path
    dst: Path
    format: str
    kind: str
    layout: str
    workers: int
    resume: bool
    settings: ConvertOptions
    labels_file: str | os.PathLike[str] | None  # a single folder's labels file
    how: str  # why the source was taken for its kind, for the summary
    prepared: Prepared | None
    splits: SplitPlan | None

    @property
    def fmt(self) -> ModuleType:
        """The format module (held by name: a module does not pickle)."""
        return by_name(self.format)

    @property
    def partial(self) -> Path:
        return partial_path(self.dst)

    @property
    def options(self) -> dict[str, Any]:
        """The options the manifest records (and the fingerprint compares)."""
        assert self.prepared is not None, "a root of splits records its options per split"
        shard_size = self.settings.shard_size
        return {"layout": self.layout, "shard_size": shard_size, **self.prepared.options}

    def job(self) -> Job:
        """The pipeline's view of this plan (:mod:`packer.write.pipeline`)."""
        assert self.prepared is not None, "a root of splits runs one job per split"
        prepared, settings = self.prepared, self.settings
        return Job(
            fmt=self.fmt,
            layout=self.layout,
            partial=self.partial,
            source=prepared.source,
            loader=prepared.loader,
            cpu_bound=prepared.cpu_bound,
            shard_size=settings.shard_size,
            workers=self.workers,
            strict=settings.strict,
            progress=settings.progress,
            unit=prepared.unit,
            on_event=settings.on_event,
            after_shard=settings.after_shard,
            max_file_size=settings.limits.max_file_size if self.kind == "image" else None,
        )

    def for_split(self, split: str, dst: Path, resume: bool) -> ConversionPlan:
        """The plan of one split of a root of splits, converted into ``dst``; checked as a
        single folder's plan is (destination, reach)."""
        assert self.splits is not None, "only a root of splits has splits"
        plan = dataclasses.replace(
            self,
            src=self.src / split,
            dst=dst,
            kind="image",
            layout=default_layout(self.fmt, "image"),
            resume=resume,
            how="detected",
            prepared=self.splits.prepared[split],
            splits=None,
        )
        check_destination(dst, plan.settings.overwrite, plan.src, resume, published_ok=resume)
        assert plan.prepared is not None  # --strict was applied to every split by plan_splits
        check_reach(plan.src, sample_folders(plan.prepared.source), dst)
        return plan

    def splits_fingerprint(self) -> dict[str, Any]:
        """What a root of splits' output depends on besides each split's own fingerprint."""
        assert self.splits is not None, "only a root of splits has splits"
        settings = self.settings
        named = {
            "format": self.format,
            "shard_size": settings.shard_size,
            "check": settings.check,
            "strict": settings.strict,
            **dataclasses.asdict(settings.limits),
            **settings.kind_options(),
        }
        return {
            "root": str(self.src.resolve()),
            "splits": self.splits.splits,
            "options": {k: named.get(k) for k in _SPLITS_FINGERPRINTED},
        }


def _check_scan(plan: ConversionPlan) -> None:
    """Refuse a destination the scan reaches, and (``strict``) a source with a skipped input."""
    assert plan.prepared is not None
    source = plan.prepared.source
    check_reach(plan.src, sample_folders(source), plan.dst)
    if plan.settings.strict and source.skipped:
        raise InputFileError(f"{source.skipped[0].path}: {source.skipped[0].reason} (--strict)")


def plan_conversion(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    options: ConvertOptions | None = None,
    **keywords: Any,
) -> ConversionPlan:
    """Plan converting ``src`` into ``dst`` with ``options`` (a
    :class:`~packer.write.options.ConvertOptions`; ``keywords``, :func:`packer.convert`'s, replace
    some of them): scan the source and check the destination; return the plan. Writes nothing.

    Raises:
        PackerError: bad arguments, a bad source or destination, or (with ``strict``) a bad file.
    """
    settings = options_of(options, keywords)
    source_options, kind, split = settings.source_options, settings.kind, settings.split
    if is_url(src):
        src = fetch_parquet(str(src), source_options) or fetch_tars(str(src), source_options)
    elif source_options:
        raise PackerError(f"source_options apply to a URL source, not the path {str(src)!r}")
    src_path, dst_path = Path(src), Path(os.fspath(dst).rstrip("/") or "/")
    _check_resolvable(src_path, "source", SourceError)
    _check_resolvable(dst_path, "destination", DestinationError)
    fmt = by_name(settings.format) if settings.format else format_for(dst_path)
    hf = hf_source(src_path) if kind in (None, "hf") else None  # a DatasetDict has splits too
    found = hf.splits if hf is not None else find_splits(src_path) if kind != "video" else []
    wanted = list(split or found)
    unknown = [w for w in wanted if w not in found]
    if unknown:
        raise PackerError(
            f"{str(src_path)!r} has no split {unknown[0]!r}"
            + (f"; it has {', '.join(found)}" if found else " (it is not a split root)")
        )
    plan = ConversionPlan(
        src=src_path,
        dst=dst_path,
        format=fmt.NAME,
        kind=kind or "",
        layout="",
        workers=settings.workers or available_cpus(),
        resume=settings.resume,
        settings=settings,
        labels_file=None,
        how="given" if kind else "detected",
        prepared=None,
        splits=None,
    )
    labels = settings.labels
    if wanted:
        return _plan_splits(plan, found, wanted, labels)
    return _plan_folder(plan, labels)


def _check_resolvable(path: Path, what: str, error: type[PackerError]) -> None:
    """Refuse a path whose links loop (``src -> src``): nothing could be read or written."""
    try:
        path.resolve()
    except (RuntimeError, OSError) as exc:  # Python 3.11's resolve: RuntimeError on a loop
        raise error(
            f"{what} {str(path)!r} cannot be resolved: a symbolic link loop on its way ({exc}); "
            f"give the folder it should name"
        ) from exc


def _prepare_split(plan: ConversionPlan) -> functools.partial[Prepared]:
    return functools.partial(prepare_split, plan.fmt, plan.settings)


def _prepare_hf(plan: ConversionPlan) -> functools.partial[Prepared]:
    return functools.partial(prepare_hf, fmt=plan.fmt, options=plan.settings)


def _plan_splits(
    plan: ConversionPlan, found: list[str], wanted: list[str], labels: Labels | None
) -> ConversionPlan:
    """A root of splits (``found`` its splits): every wanted split checked and scanned
    (:func:`plan_splits`, which also applies ``--strict`` to each)."""
    settings = plan.settings
    if settings.part is not None:
        raise PackerError("--part does not take a root of splits; convert each --split")
    check_destination(plan.dst, settings.overwrite, plan.src, plan.resume, published_ok=plan.resume)
    classes = list(settings.classes) if settings.classes is not None else None
    hf = hf_source(plan.src) if plan.kind in ("", "hf") else None
    if hf is not None:
        split_plan = plan_hf_splits(hf, wanted, _prepare_hf(plan), classes, settings.strict)
    else:
        split_plan = plan_splits(
            plan.src, wanted, _prepare_split(plan), labels, classes, settings.strict, found
        )
    return dataclasses.replace(plan, kind="splits", splits=split_plan)


def _plan_folder(plan: ConversionPlan, labels: Labels | None) -> ConversionPlan:
    """A single folder: its destination checked, its kind detected, its source scanned."""
    settings = plan.settings
    file = one_labels_file(labels, plan.src) if isinstance(labels, Mapping) else labels
    dst = plan.dst
    if settings.part is not None:
        check_part(settings.part)
        dst = part_path(dst, settings.part[0])
    check_destination(dst, settings.overwrite, plan.src, plan.resume, published_ok=plan.resume)
    kind, how = plan.kind or None, plan.how
    if not kind:
        how = "a labels file" if file is not None else "detected"
    if kind is None and settings.fields.annotations:
        kind, how = "coco", "given: --annotations"
    if kind is None and file is None:
        detection = detect_fields(plan.src) or detect(plan.src, class_dirs(plan.src))
        kind, how = detection.kind, f"detected: {detection.reason}"
    kind = kind or "image"
    fmt = plan.fmt
    classes = list(settings.classes) if settings.classes is not None else None
    prepare_kind = (
        functools.partial(prepare_hf_source, _prepare_hf(plan)) if kind == "hf" else prepare
    )
    prepared = prepare_kind(kind, plan.src, fmt, settings, classes, file)
    planned = dataclasses.replace(
        plan,
        dst=dst,
        kind=kind,
        layout=default_layout(fmt, kind),
        labels_file=file,
        how=how,
        prepared=prepared,
    )
    _check_scan(planned)
    return planned
