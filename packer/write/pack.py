"""``packer.pack``: samples made by the user's own function from any inputs, packed in parallel.

LitData's ``optimize`` with packer's guarantees: ``fn(input)`` runs on every input, in
``workers`` processes or on an ``executor``; the samples it returns are written in input order
by a :class:`packer.write.pack_writer.PackWriter`, so the output is the same bytes for any
number of workers. An input whose ``fn`` raises is skipped and listed with the reason (``packer
inspect --skipped``; ``strict=True`` stops instead); one ``fn`` leaves out by returning ``None``
is counted. ``resume=True`` after a kill continues from the last durable shard, refusing inputs,
``fn`` or options that changed. Nothing appears at ``dst`` before the whole run is done.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from packer.core.cpus import available_cpus
from packer.core.manifest import MANIFEST_NAME, load_manifest
from packer.errors import DestinationError, PackerError
from packer.formats import format_for
from packer.remote.storage import is_url
from packer.source.images import SkippedInput
from packer.write.destination import partial_path
from packer.write.pack_inputs import (
    KEY_DIGITS,
    Outcome,
    PackSpec,
    as_inputs,
    describe_input,
    fn_identity,
    inputs_digest,
)
from packer.write.pack_map import outcomes
from packer.write.pack_writer import PACK_PART_VERSION, PackWriter, part_manifest
from packer.write.plan import DEFAULT_SHARD_SIZE
from packer.write.result import ConvertResult
from packer.write.tasks import PART_MANIFEST, check_part, part_path
from packer.write.writer_values import (
    DEFAULT_CHECK,
    DEFAULT_JPEG_QUALITY,
    Check,
    check_check,
    declared_fields,
)

__all__ = ["pack"]


def _workers(workers: int | None, executor: Any) -> int:
    if workers is None:
        return 1 if executor is not None else max(1, available_cpus())
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise PackerError(f"workers={workers!r}: expected a whole number >= 1")
    return workers


def _spec(fn: Any, fields: Any, jpeg_quality: int, check: Any, count: int) -> PackSpec:
    if fn is not None and not callable(fn):
        raise PackerError(f"fn={fn!r} is not callable: give a function input -> sample dict")
    declared = declared_fields(fields)
    return PackSpec(
        fn=fn,
        names=tuple(declared) if declared is not None else None,
        declared=declared,
        jpeg_quality=jpeg_quality,
        width=max(KEY_DIGITS, len(str(max(count - 1, 0)))),
        check=check_check(check),
    )


def _write(writer: PackWriter, inputs: Any, outcome: Outcome, strict: bool, skip_to: int) -> None:
    """Write one input's samples (from its ``skip_to``-th on), or list why it has none."""
    where = describe_input(inputs, outcome.index)
    reason = outcome.error
    if reason is None:
        keys = [key for key, _ in outcome.samples[skip_to:]]
        if any(not isinstance(key, str) for key in keys):
            bad = next(key for key in keys if not isinstance(key, str))
            reason = f"a '__key__' that is a {type(bad).__name__}, not a str: {bad!r}"
        elif len({key.casefold() for key in keys}) != len(keys):
            reason = "two of its samples have the same '__key__' (keys are unique, ignoring case)"
        else:
            for key in keys:
                try:
                    writer.check_key(key)
                except PackerError as exc:
                    reason = str(exc)
                    break
    if reason is not None:
        if strict:
            error = PackerError(f"{where}: {reason} (strict: the run stops)")
            if outcome.trace:
                error.add_note(outcome.trace.rstrip())
            raise error
        writer.skip(where, reason)
        return
    if not outcome.samples:
        writer.left_out += 1
    for number, (key, encoded) in enumerate(outcome.samples[skip_to:], skip_to):
        writer.position = (outcome.index, number)
        writer.append(key, encoded)


def _complete(dst: Path, is_part: bool) -> ConvertResult | None:
    """With ``resume``: ``dst`` already published by a pack (a kill after it appeared) and no
    ``DST.partial``: nothing to do."""
    if (
        partial_path(dst).exists()
        or not (dst / (PART_MANIFEST if is_part else MANIFEST_NAME)).is_file()
    ):
        return None
    try:
        manifest = part_manifest(dst) if is_part else load_manifest(dst)
    except (PackerError, OSError, ValueError, KeyError, TypeError):
        return None
    if manifest.opts.source_kind != "pack":
        return None
    return ConvertResult(
        dst=dst,
        manifest=manifest,
        seconds=0.0,
        bytes_in=0,
        bytes_out=sum(s.bytes for s in manifest.shards),
        skipped=[SkippedInput(s["path"], s["reason"]) for s in manifest.skipped],
        notes=[f"{str(dst)!r} is already complete: nothing to resume"],
    )


def pack(
    inputs: Iterable[Any],
    dst: str | os.PathLike[str],
    fn: Callable[[Any], Any] | None = None,
    *,
    workers: int | None = None,
    resume: bool = False,
    strict: bool = False,
    progress: bool = True,
    executor: Any = None,
    fields: Iterable[str] | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    overwrite: bool = False,
    jpeg_quality: int = DEFAULT_JPEG_QUALITY,
    check: Check = DEFAULT_CHECK,
    part: tuple[int, int] | None = None,
) -> ConvertResult:
    """Run ``fn`` on every input and pack the samples it returns into a new dataset at ``dst``.

    Args:
        inputs: any sequence (paths, ids, anything picklable), an iterable (read into a list),
            or a map-style ``torch.utils.data.Dataset``.
        dst: the dataset to create (``.lmdb``, ``.npy``, ``.h5``), a dataset with fields.
        fn: ``fn(input)`` returns a sample dict (``{"__key__": ..., "jpg": ..., "cls": ...}``;
            without ``__key__`` the input's position is the key), ``None`` (leave the input
            out), or an iterable of sample dicts. Without ``fn`` each input is a sample (a
            tuple named by ``fields``).
        workers: processes running ``fn`` (default: the CPUs available; 1 runs it here).
        resume: continue an interrupted run from its last complete shard (same inputs, ``fn``
            and options); the bytes are those of an uninterrupted run.
        strict: stop at the first input that fails, instead of skipping and listing it.
        progress: show a tqdm bar of the samples written.
        executor: run ``fn`` on it (anything with ``submit``: a ``distributed.Client``, a
            process pool); the output is the same bytes.
        fields: the field names, declared up front (required to name a tuple's parts).
        shard_size: roll to a new shard past this many bytes; the unit of ``resume``.
        overwrite: replace an existing dataset at ``dst`` (only once the new one is complete).
        jpeg_quality: the quality pixels are encoded at in a ``jpg`` field.
        check: how the bytes ``fn`` returns for an image (or audio) field are checked, in the
            worker, as :class:`packer.Writer`'s ``check`` (and ``packer convert --check``):
            ``"scan"`` (default: the whole compressed stream walked), ``"fast"`` (header and
            end marker only) or ``"decode"``. An input whose bytes fail is skipped and listed
            (``strict``: the run stops).
        part: ``(i, n)``: pack only the ``i``-th of ``n`` equal runs of consecutive inputs,
            into ``DST.part-i``, for :func:`packer.merge` to join (keys stay those of one run).

    Returns:
        What was written: the manifest, the skipped inputs and the time it took.

    Raises:
        PackerError: bad arguments, ``strict`` and an input that failed, a destination that
            exists (without ``overwrite``), or no sample at all.
    """
    started = time.perf_counter()
    if is_url(dst):
        raise DestinationError(
            f"pack writes a local dataset, not the URL {dst!r}: pack into a local folder, then "
            "upload it (packer upload)"
        )
    if resume and overwrite:
        raise PackerError("resume and overwrite exclude each other: choose one")
    count_workers = _workers(workers, executor)
    sequence = as_inputs(inputs)
    spec = _spec(fn, fields, jpeg_quality, check, len(sequence))
    if not len(sequence):
        raise PackerError("inputs is empty: nothing to pack")
    options = {"fn": fn_identity(fn), "fields": spec.names, "jpeg_quality": jpeg_quality}
    options.update(shard_size=shard_size, check=spec.check)  # what skips an input: fingerprinted
    lo, hi, target, part_record = 0, len(sequence), Path(os.fspath(dst).rstrip("/")), None
    if part is not None:
        check_part(part)
        lo, hi = part[0] * len(sequence) // part[1], (part[0] + 1) * len(sequence) // part[1]
        target = part_path(target, part[0])
    fingerprint = {
        "format": format_for(os.fspath(dst).rstrip("/")).NAME,
        "options": options,
        "root": "packer.pack",
        "classes": 0,
        "files": len(sequence),
        "bytes": 0,
        "inputs_xxh3_64": inputs_digest(sequence),
    }
    if part is not None:  # every part has the job's fingerprint; its progress, its own part too
        part_record = {
            "packer_pack_part": PACK_PART_VERSION,
            "part": list(part),
            "dst": os.fspath(dst),
            "job": fingerprint,
        }
        fingerprint = {**fingerprint, "options": {**options, "part": list(part)}}
    if resume and (done := _complete(target, part is not None)) is not None:
        return done
    writer = PackWriter(
        target, fingerprint=fingerprint, resume=resume, part=part_record, fields=fields,
        shard_size=shard_size, overwrite=overwrite, jpeg_quality=jpeg_quality, check=spec.check,
        progress=progress,
    )  # fmt: skip
    with writer:
        start, skip_to = writer.resumed_at or (lo, 0)
        for outcome in outcomes(sequence, spec, start, count_workers, executor, hi):
            _write(writer, sequence, outcome, strict, skip_to if outcome.index == start else 0)
        writer.position = (hi, 0)
    manifest = writer.manifest
    assert manifest is not None
    notes = (
        [
            f"resumed at input {start}"
            if writer.resumed_at
            else "nothing to resume: packed from the start"
        ]
        if resume
        else []
    )
    if writer.left_out:
        notes.append(f"{writer.left_out} input(s) left out by fn (it returned None)")
    return ConvertResult(
        dst=writer.dst,
        manifest=manifest,
        seconds=time.perf_counter() - started,
        bytes_in=writer._source.total_bytes,  # the samples' encoded bytes
        bytes_out=sum(s.bytes for s in manifest.shards),
        skipped=list(writer._source.skipped),
        notes=notes,
    )
