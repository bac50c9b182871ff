"""Load source samples in parallel, yielding results in source order with bounded memory.

One pool for every kind: a *loader* turns one source sample into its records (an image's
bytes, a video's frames) or a reason it cannot be used; :func:`load_in_order` runs a loader over
all samples with threads (IO-bound copies) or processes (decoding, encoding), at most
``8 × workers`` in flight, results in order, so the output never depends on ``workers``.
Pool processes exit when the converting process dies, even by SIGKILL. One input never stops
a conversion: an exception a loader raises that is not packer's (a library's on odd bytes)
becomes that sample's skip reason, ``unexpected error: <type>: <message>``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
import signal
import stat
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from packer.core.manifest import bytes_checksum
from packer.decode.check import check_image
from packer.errors import InputFileError, PackerError
from packer.source.links import read_source_file
from packer.write.options import DEFAULT_MAX_FILE_SIZE, Limits

__all__ = [
    "DEFAULT_MAX_FILE_SIZE",
    "Loaded",
    "load_image",
    "load_in_order",
    "load_source_files",
    "read_input",
    "skip_unexpected",
    "stored_image",
]

T = TypeVar("T")


@dataclass
class Loaded:
    """One source sample after loading: its records, or the reason it cannot be used."""

    records: list[bytes] | None
    reason: str | None = None
    dropped: list[tuple[str, str]] = field(default_factory=list)  # (part's path, reason)
    checksums: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.records is not None and not self.checksums:
            self.checksums = [bytes_checksum(r) for r in self.records]


def read_input(path: str, max_bytes: int = DEFAULT_MAX_FILE_SIZE) -> bytes:
    """Read one source file whole: a regular file (never a FIFO or a device) of at most
    ``max_bytes``, checked before reading.

    Raises:
        InputFileError: with the reason, for a file that cannot or must not be read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise InputFileError(f"cannot read: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError("not a regular file (a FIFO, socket or device?)")
        if st.st_size > max_bytes:
            raise InputFileError(
                f"{st.st_size / 1e6:.1f} MB, over the {max_bytes / 1e6:.0f} MB limit "
                "(--max-file-size)"
            )
        os.set_blocking(fd, True)
        try:  # the size stat'ed plus one byte: a file that grew since shows it without a
            data = _read_upto(fd, st.st_size + 1)  # max_bytes buffer per read (64 MB each)
            if len(data) > st.st_size:
                data += _read_upto(fd, max_bytes + 1 - len(data))
        except OSError as exc:
            raise InputFileError(f"cannot read: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise InputFileError(f"grew past the {max_bytes / 1e6:.0f} MB limit while being read")
    return data


def _read_upto(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``'s position, fewer only at the end of the file: plain
    ``os.read`` calls, no buffered file object (a third of the time of reading a small file,
    measured on 20,000 files of 1–90 KB)."""
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = os.read(fd, limit - got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def load_image(
    sample: Any,
    check: str = "fast",
    transcode: Callable[[bytes], bytes] | None = None,
    limits: Limits | None = None,
    resize: Any = None,
) -> Loaded:
    """Read, check, resize (a :class:`packer.decode.resize.Resize`) and transcode one image file
    (``sample.path``) into one record; one over ``limits`` (default: the defaults) is skipped."""
    limits = limits or Limits()
    try:
        data = read_input(sample.path, limits.max_file_size)
    except InputFileError as exc:
        return Loaded(None, str(exc))
    if len(data) != sample.size:  # shards were planned, and --resume fingerprinted, by size
        return Loaded(
            None,
            f"changed during the conversion ({sample.size} bytes scanned, {len(data)} read); "
            "convert again once it is complete",
        )
    return stored_image(data, check, transcode, limits.max_pixels, resize)


def stored_image(
    data: bytes,
    check: str,
    transcode: Callable[[bytes], bytes] | None,
    max_pixels: int,
    resize: Any = None,
) -> Loaded:
    """The one record of the image ``data``: checked, resized, transcoded; or why it cannot
    be used (every image source's last step)."""
    try:
        check_image(data, check, max_pixels)
    except InputFileError as exc:
        return Loaded(None, str(exc))
    try:  # raise ImageError on bad bytes (anything else: skip_unexpected's business)
        if resize is not None:
            data = resize.apply(data)
        if transcode is not None:
            data = transcode(data)
    except InputFileError as exc:
        return Loaded(None, f"cannot decode: {exc}")
    return Loaded([data])


def load_source_files(
    sample: Any,
    loader: Callable[[Any], Loaded],
    root: str,
    follow_links: bool = False,
    max_file_size: int = DEFAULT_MAX_FILE_SIZE,
) -> Loaded:
    """``loader(sample)`` once each whole-file part of a sample with fields is read through
    :func:`packer.source.links.read_source_file` (beneath the source's real ``root``, a link
    leaving it refused unless ``follow_links``): every field source's files are read here."""
    parts = []
    for part in sample.parts:
        if part.data is None and part.offset < 0:
            try:
                data = read_source_file(root, part.path, follow_links, max_file_size)
            except InputFileError as exc:
                return Loaded(None, f"field {part.field!r}: {exc}")
            if len(data) != part.size:
                return Loaded(
                    None,
                    f"field {part.field!r}: changed during the conversion ({part.size} bytes "
                    f"scanned, {len(data)} read); convert again once it is complete",
                )
            part = dataclasses.replace(part, data=data)
        parts.append(part)
    return loader(dataclasses.replace(sample, parts=tuple(parts)))


def skip_unexpected(loader: Callable[[T], Loaded], sample: T) -> Loaded:
    """``loader(sample)``, or a skip when it raises an exception that is not packer's.

    A loader returns a reason for every problem it knows; an exception of another type (a
    library's bug on odd bytes, say) is still one input's problem, so it skips that input,
    with ``unexpected error: <type>: <message>`` as its reason, rather than ending the run.
    Packer's own errors (e.g. PyAV missing: every input would fail) and ``MemoryError``
    propagate, as do ``KeyboardInterrupt`` and ``SystemExit``.
    """
    try:
        return loader(sample)
    except (PackerError, MemoryError):
        raise
    except Exception as exc:  # noqa: BLE001 - one input's failure, whatever its type
        return Loaded(None, f"unexpected error: {type(exc).__name__}: {exc}")


def _die_with_parent(parent: int | None) -> None:
    """Pool-worker initializer: exit when the converting process dies, even by SIGKILL
    (``parent``; None: the worker's own parent, a forkserver, which ends with that process).

    Forked pool workers hold the task pipe open themselves, so they never see EOF when the
    parent is killed; without this they would linger forever.
    """
    if parent is None:
        parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL) == 0:  # PR_SET_PDEATHSIG (Linux): no thread needed
            if os.getppid() != parent:  # the parent died before the signal was asked for
                os._exit(1)
            return
    except (OSError, AttributeError):
        pass
    # Elsewhere, a watching thread. Not on Linux: a thread started in a child forked from a
    # process with threads can hang in its start (a lock held at the fork), and the pool's
    # shutdown then waits for that worker for ever (seen in the suite, disk-full test).

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _executor(workers: int, cpu_bound: bool) -> Executor:
    if not cpu_bound:
        return ThreadPoolExecutor(workers, thread_name_prefix="packer-load")
    if "av" in sys.modules:  # PyAV (FFmpeg) ran here: its threads' locks may be held at a
        # fork, and a forked worker decoding then hangs for ever (seen in the suite, mp4
        # conversions): the workers start from a forkserver, a process that never ran FFmpeg
        context = multiprocessing.get_context("forkserver")
        return ProcessPoolExecutor(
            workers, mp_context=context, initializer=_die_with_parent, initargs=(None,)
        )
    return ProcessPoolExecutor(workers, initializer=_die_with_parent, initargs=(os.getpid(),))


def _load_batch(loader: Callable[[T], Loaded], batch: list[T]) -> list[Loaded]:
    return [skip_unexpected(loader, sample) for sample in batch]


def _batches(samples: Iterable[T], batch_bytes: int) -> Iterator[list[T]]:
    """Consecutive samples, grouped until a group's ``size`` reaches ``batch_bytes`` (at most
    ``_BATCH_MAX`` of them; one sample alone when ``batch_bytes`` is 0)."""
    batch: list[T] = []
    size = 0
    for sample in samples:
        batch.append(sample)
        size += getattr(sample, "size", batch_bytes)
        if size >= batch_bytes or len(batch) >= _BATCH_MAX:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


_BATCH_MAX = 64


def load_in_order(
    loader: Callable[[T], Loaded],
    samples: Iterable[T],
    workers: int,
    cpu_bound: bool,
    batch_bytes: int = 0,
) -> Generator[Loaded, None, None]:
    """Yield ``loader(sample)`` for every sample, in the order given.

    With ``workers > 1`` a thread pool (``cpu_bound=False``) or a process pool loads ahead; at
    most ``8 × workers`` tasks are in flight, so memory stays bounded however large the
    source. A task loads consecutive samples of ``batch_bytes`` source bytes together (each
    sample's ``size``; one sample a task when 0), which spreads a pool's cost per task over
    many small files. The results do not depend on ``workers`` or ``batch_bytes``.
    """
    if workers <= 1:
        for sample in samples:
            yield skip_unexpected(loader, sample)
        return
    window = 8 * workers if batch_bytes == 0 else 2 * workers
    executor = _executor(workers, cpu_bound)
    pending: deque = deque()
    try:
        for batch in _batches(samples, batch_bytes):  # guarded in the worker: an exception
            pending.append(executor.submit(_load_batch, loader, batch))  # may not unpickle
            if len(pending) >= window:
                yield from pending.popleft().result()
        while pending:
            yield from pending.popleft().result()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
