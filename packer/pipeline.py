"""Read and check source files in parallel, yielding results in scan order with bounded memory."""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

from packer.check import check_image
from packer.errors import InputFileError
from packer.manifest import bytes_checksum

__all__ = ["Loaded", "load_file", "load_in_order"]


@dataclass(frozen=True)
class Loaded:
    """One source file after reading, checking and (optionally) transcoding."""

    data: bytes | None
    checksum: int = 0
    reason: str | None = None


def load_file(
    path: str, check: str = "fast", transcode: Callable[[bytes], bytes] | None = None
) -> Loaded:
    """Read, check and transcode one file; a problem becomes ``Loaded(None, reason=...)``."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        return Loaded(None, reason=f"cannot read: {exc.strerror or exc}")
    try:
        check_image(data, check)
        if transcode is not None:
            data = transcode(data)
    except InputFileError as exc:
        return Loaded(None, reason=str(exc))
    except (OSError, ValueError, SyntaxError) as exc:  # transcode failures
        return Loaded(None, reason=f"cannot decode: {exc}")
    return Loaded(data, bytes_checksum(data))


def _die_with_parent(parent: int) -> None:
    """Pool-worker initializer: exit when the converting process dies, even by SIGKILL.

    Forked pool workers hold the task pipe open themselves, so they never see EOF when the
    parent is killed; without this they would linger forever.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _executor(workers: int, cpu_bound: bool) -> Executor:
    if cpu_bound:
        return ProcessPoolExecutor(workers, initializer=_die_with_parent, initargs=(os.getpid(),))
    return ThreadPoolExecutor(workers, thread_name_prefix="packer-read")


def load_in_order(
    paths: Iterable[str],
    workers: int,
    check: str = "fast",
    transcode: Callable[[bytes], bytes] | None = None,
) -> Iterator[Loaded]:
    """Yield ``load_file`` of every path, in the order given.

    With ``workers > 1`` files are read by a thread pool (IO-bound), or a process pool when a
    transcode decodes images (CPU-bound); at most ``8 × workers`` results are in flight, so
    memory stays bounded however large the source. The results do not depend on ``workers``.
    """
    if workers <= 1:
        for path in paths:
            yield load_file(path, check, transcode)
        return
    window = 8 * workers
    executor = _executor(workers, cpu_bound=transcode is not None)
    pending: deque = deque()
    try:
        for path in paths:
            pending.append(executor.submit(load_file, path, check, transcode))
            if len(pending) >= window:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        executor.shutdown(wait=True, cancel_futures=True)


def default_workers() -> int:
    """One worker per CPU this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
