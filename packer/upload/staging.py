"""Convert (or merge) into a URL: the output is built by the ordinary converter in a local
staging folder, with all its checks, ``resume`` and checksums, then uploaded by
:mod:`packer.upload.uploader` (data first, manifest last) and the staging folder removed.

The staging folder of ``s3://bucket/out.lmdb`` is ``<root>/<hash of the URL and the store's
options>/`` (:func:`staging_folder`),
holding ``out.lmdb`` (or ``out.lmdb.partial`` while it is built), the upload journal and a
lock; ``<root>`` is ``staging=`` (``--staging DIR``), else ``$PACKER_CACHE_DIR/staging``, else
``$XDG_CACHE_HOME/packer/staging`` (``~/.cache/packer/staging``).

How much room it needs: a conversion sends each shard as soon as it is checkpointed and
releases its staged copy (:mod:`packer.upload.stream`), so staging holds ``staging_limit``
(default four shards) plus the shard being written and the one being finished, and the tables.
With an ``executor`` (``--dask``) at most twice its slots of shards are written ahead of the
upload. A ``part`` sends its own shards the same way (its checkpoints stay for the merge), and
:func:`merge_to_url` then uploads only the tables and manifests. With ``keep_staging`` the
whole output is staged until the upload (the dataset's size: the source's for LMDB/HDF5/NPY,
~10× more for BMP). ``--dask`` workers and ``--part`` tasks on several nodes need a staging root
that all of them share, as a local destination must be shared today (the journal is appended
under ``flock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packer.core.cpus import packer_home
from packer.core.sizes import parse_size
from packer.errors import DatasetExistsError, DestinationError, PackerError
from packer.source.images import check_source_folder
from packer.upload.identity import store_identity
from packer.upload.stream import ShardStream, stream_limit
from packer.upload.uploader import JOURNAL_NAME, Journal, Uploader
from packer.write.convert import convert
from packer.write.disk_full import streamed
from packer.write.merge import merge
from packer.write.plan import DEFAULT_SHARD_SIZE
from packer.write.result import ConvertResult

__all__ = [
    "convert_to_url",
    "dataset_name",
    "held_staging",
    "merge_to_url",
    "staging_folder",
    "staging_root",
    "start_upload",
    "store_identity",
    "upload_staged",
]

_MARK = "staging.json"  # says the folder is a packer staging folder, and of which URL
_LOCK = ".lock"


def staging_root(staging: str | os.PathLike[str] | None = None) -> Path:
    """Where staging folders live: ``staging``, else ``$PACKER_CACHE_DIR/staging``, else
    ``$XDG_CACHE_HOME/packer/staging`` (``~/.cache/packer/staging``)."""
    if staging is not None:
        return Path(staging).expanduser()
    return packer_home() / "staging"


def staging_folder(
    url: str, staging: Any = None, storage_options: dict[str, Any] | None = None
) -> Path:
    """The staging folder of ``url`` under :func:`staging_root`: named by a hash of the URL and
    of the store it reaches (:func:`packer.upload.identity.store_identity`: for s3 the endpoint
    the client resolves, a profile's and fsspec's configuration included), so a run to the same
    URL on another store never adopts this one's journal (and with it, the right to replace or
    delete objects there), and a resumed run reaching the same store finds it."""
    identity = url.rstrip("/") + ("\n" + store_identity(storage_options, url)).rstrip("\n")
    key = hashlib.sha256(identity.encode()).hexdigest()[:20]
    return staging_root(staging) / key


def dataset_name(url: str) -> str:
    """The dataset's folder name (``out.lmdb`` of ``s3://bucket/out.lmdb``), checked."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    bucket_only = url.rstrip("/").count("/") < 3
    if bucket_only or name in ("", ".", ".."):
        raise PackerError(
            f"{url!r} names no dataset folder inside the bucket: give one, e.g. "
            "s3://bucket/train.lmdb (its suffix picks the format)"
        )
    return name


@contextmanager
def held_staging(
    url: str, staging: Any, options: dict[str, Any], shared: bool = False
) -> Iterator[Path]:
    """Hold the staging folder of ``url``: one writer at a time, or (``shared``) any number of
    ``--part`` tasks, each locking its own part as the converter does. A folder that holds
    anything must be a packer staging folder (our mark)."""
    folder = staging_folder(url, staging, options)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise DestinationError(
            f"cannot create the staging folder {str(folder)!r} of {url!r}: {exc.strerror}. "
            "Choose a writable place with --staging DIR"
        ) from exc
    alone = False  # holding the lock exclusively: may remove the folder at the end
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DestinationError(
                f"{url!r} is being written by another packer process (its staging folder "
                f"{str(folder)!r} is locked); wait for it to finish or stop it first"
            ) from None
        alone, mark = not shared, folder / _MARK
        others = [e.name for e in folder.iterdir() if not _made_by_us(e.name, dataset_name(url))]
        if others and not mark.is_file():
            raise DestinationError(
                f"{str(folder)!r} is not a packer staging folder (it holds {others[0]!r}): "
                "choose another with --staging DIR"
            )
        if not mark.is_file():
            try:
                mark.write_text(json.dumps({"url": url.rstrip("/")}) + "\n", encoding="utf-8")
            except OSError as exc:  # a disk already full: the staging error, not a bare one
                mark.unlink(missing_ok=True)
                raise _staging_full(DestinationError(f"disk full: {exc}"), url) from exc
        yield folder
    finally:
        if alone and {e.name for e in folder.iterdir()} <= {_LOCK, _MARK}:  # done, or refused
            (folder / _MARK).unlink(missing_ok=True)
            os.unlink(folder / _LOCK)
            folder.rmdir()
        os.close(fd)


def _made_by_us(entry: str, name: str) -> bool:
    """Whether ``entry`` of a staging folder is one packer makes for the dataset ``name``: a
    removal that a kill cut short (the mark gone first) leaves only such entries."""
    ours = (_LOCK, _MARK, JOURNAL_NAME, JOURNAL_NAME + ".new")
    return entry in ours or entry.startswith((name, ".release-"))


def _work_in(folder: Path, name: str) -> bool:
    """Whether the staging ``folder`` holds a conversion of ``name`` (built, partial, parts)."""
    return any(e.name.startswith(name) for e in folder.iterdir())


def _complete_at_url(uploader: Uploader, src: Any, local: Path, kwargs: dict) -> ConvertResult:
    """``--resume`` of a conversion whose upload finished (its staging folder gone): as a
    local ``--resume`` of a published output, "already complete" if the dataset at the URL is
    this source's with these options, else refused saying what differs."""
    from packer.core.manifest import MANIFEST_NAME, parse_manifest
    from packer.write.finish import manifest_difference
    from packer.write.plan import plan_conversion
    from packer.write.resume import fingerprint

    url = uploader.url
    manifest = parse_manifest(uploader.cat(MANIFEST_NAME), f"{url}/{MANIFEST_NAME}", url)
    given = {k: v for k, v in kwargs.items() if k not in ("on_event", "executor", "workers")}
    plan = plan_conversion(src, local, progress=False, **given)
    if plan.prepared is None:  # a root of splits: each split's manifest records its options
        change = None if manifest.format == plan.format else f"format {manifest.format!r}"
    else:
        source = plan.prepared.source
        fp = fingerprint(source, plan.format, plan.options)
        change = manifest_difference(manifest, fp, source, _created_ns(manifest.created), url)
    if change is not None:
        raise DestinationError(
            f"{url!r} holds a finished dataset and there is nothing to resume: {change}; pass "
            "--overwrite to replace it"
        )
    result = ConvertResult(dst=url, manifest=manifest, seconds=0, bytes_in=0, bytes_out=0)
    result.notes.append(f"{url!r} is already complete (same source and options): nothing to do")
    return result


def _created_ns(created: str) -> int:
    """The end of the second a manifest's ``created`` stamp names, in ns (0: unreadable)."""
    import datetime

    try:
        stamp = datetime.datetime.strptime(created, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return 0
    return int(stamp + 1) * 10**9 - 1


def _clear(folder: Path, keep: tuple[str, ...] = (_LOCK,)) -> None:
    """Remove everything in ``folder`` but ``keep``; the mark last (a kill leaves it while
    anything else is there)."""
    for entry in sorted(folder.iterdir(), key=lambda e: e.name == _MARK):
        if entry.name not in keep:
            _remove(entry)


def start_upload(folder: Path, journal: Journal, url: str) -> None:
    """A new upload into the held staging ``folder``: what an earlier one left removed (the
    lock, the mark and the journal kept), its journal reset to ``url``."""
    _clear(folder, keep=(_LOCK, _MARK, JOURNAL_NAME))
    journal.reset(url.rstrip("/"))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _staging_full(exc: DestinationError, url: str) -> DestinationError:
    """A full disk while staging: the same message, saying where staging is and how to move it."""
    return DestinationError(
        f"{exc} (this is the local staging folder of the upload to {url!r}; the space needed "
        "there is --staging-limit plus two shards and their checkpoints, the whole output with "
        "--keep-staging: choose a disk with room with --staging DIR, or lower --staging-limit, "
        "then run the same command with --resume)"
    )


def convert_to_url(
    src: str | os.PathLike[str],
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    staging: str | os.PathLike[str] | None = None,
    keep_staging: bool = False,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool = True,
    part: tuple[int, int] | None = None,
    staging_limit: int | str | None = None,
    **kwargs: Any,
) -> ConvertResult:
    """Convert ``src`` into the dataset at ``url`` (``s3://bucket/out.lmdb``): built in a
    staging folder by :func:`packer.write.convert.convert` (the other arguments are its own), then
    uploaded, the manifest last (:mod:`packer.upload.uploader`).

    Args:
        storage_options: fsspec options of the store (``endpoint_url``, ...).
        staging: the staging root (see :func:`staging_root`); it needs room for the output.
        keep_staging: keep the staged output after the upload (else it is removed); the
            whole output is then staged (nothing is sent during the conversion).
        staging_limit: bytes of finished shards that may wait for their upload (an int or
            ``"4GB"``; default: four shards). Shards are sent while the conversion runs and
            their staged copies released (:mod:`packer.upload.stream`), so staging holds
            about this plus the two shards being written and finished, not the dataset.
        overwrite: replace a packer dataset at ``url`` (its manifest deleted first).
        resume: continue an interrupted conversion or upload; objects already uploaded (the
            journal and the store agree) are not sent again.
        part: ``(i, n)``: only convert part ``i``, sending its shards (no manifest);
            :func:`merge_to_url` joins the parts (all in the same staging root) and uploads
            the tables and manifest.

    Raises:
        PackerError: as :func:`packer.write.convert.convert`; the destination refused; an upload
            failed (naming the URL).
    """
    name = dataset_name(url)
    options = dict(storage_options or {})
    check_source_folder(Path(src))  # a mistyped source is said before the store is asked
    with held_staging(url, staging, options, shared=part is not None) as folder:
        local, journal = folder / name, Journal(folder / JOURNAL_NAME)
        uploader = Uploader(url, options, journal, resume)
        try:
            uploader.check(overwrite, local)  # before the conversion: refuse early
        except DatasetExistsError:
            if not resume or part is not None or _work_in(folder, name):
                raise
            return _complete_at_url(uploader, src, local, kwargs)
        if not resume and part is None:  # start over, still owning an upload of ours
            start_upload(folder, journal, url)
        stream = None
        room: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if not keep_staging:
            shard = parse_size(kwargs.get("shard_size", DEFAULT_SHARD_SIZE))
            limit = stream_limit(shard, staging_limit)
            stream = ShardStream(uploader, local, limit, overwrite, kwargs.pop("on_event", None))
            kwargs.update(after_shard=stream.after_shard, on_event=stream.on_event)
            room = streamed(limit, shard)  # a full disk asks for what streaming holds
        try:
            with room:
                result = convert(src, local, resume=resume, progress=progress, part=part, **kwargs)
        except DestinationError as exc:
            if str(exc).startswith(("disk full", "not enough space")):
                raise _staging_full(exc, url) from exc
            raise
        else:
            if stream is not None:
                stream.drain()  # nothing left queued: the tables event drained it
        finally:
            if stream is not None:
                stream.close()
        if part is not None:
            sent = f"its {stream.uploaded} data file(s) uploaded" if stream else "nothing uploaded"
            result.notes.append(
                f"part {part[0]}/{part[1]} staged in {str(folder)!r} ({sent}; no manifest yet): "
                f"when every part is done, run  packer merge {url} --staging {staging_root(staging)}"
            )
            return result
        return upload_staged(
            result, uploader, local, url, overwrite, progress, keep_staging, stream
        )


def merge_to_url(
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    staging: str | os.PathLike[str] | None = None,
    keep_staging: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> ConvertResult:
    """Join the parts staged by ``convert_to_url(..., part=(i, n))`` (same ``url`` and staging
    root) with :func:`packer.write.merge.merge`, then upload the result as :func:`convert_to_url`
    does; run again after an interruption, it resumes the upload."""
    name = dataset_name(url)
    options = dict(storage_options or {})
    with held_staging(url, staging, options) as folder:
        local = folder / name
        remerge = not (local / "packer.json").is_file() or any(folder.glob(f"{name}.part-*"))
        journal = Journal(folder / JOURNAL_NAME)
        uploader = Uploader(url, options, journal, resume=not remerge)
        uploader.check(overwrite, local)  # a new merge replaces a dataset only with overwrite
        if remerge:
            journal.claim(url.rstrip("/"))  # a new upload, of ours (the parts' lines kept)
            result = merge(local, overwrite=True, progress=progress)
        else:  # merged before an interrupted upload: upload it
            result = ConvertResult(
                dst=local, manifest=_manifest(local), seconds=0, bytes_in=0, bytes_out=0
            )
        for part in sorted(folder.glob(f"{name}.part-*")):
            _remove(part)
        return upload_staged(result, uploader, local, url, overwrite, progress, keep_staging)


def _manifest(local: Path) -> Any:
    from packer.core.manifest import load_manifest

    return load_manifest(local)


def upload_staged(
    result: ConvertResult,
    uploader: Uploader,
    local: Path,
    url: str,
    overwrite: bool,
    progress: bool,
    keep_staging: bool,
    stream: ShardStream | None = None,
) -> ConvertResult:
    """Upload the staged ``local``; the result names the URL and says what was done."""
    report = uploader.upload(local, overwrite, progress)
    if stream is not None:  # its objects were sent before, and counted as already there
        report.streamed, report.streamed_bytes = stream.uploaded, stream.bytes
        report.skipped = max(0, report.skipped - stream.uploaded)
        report.uploaded += stream.uploaded
        report.bytes += stream.bytes
    result.dst = url
    result.notes.append(report.summary())
    if keep_staging:
        result.notes.append(f"the staged output is kept in {str(local)!r}")
    else:  # the lock and the folder go when it is released
        _clear(local.parent)
    return result
