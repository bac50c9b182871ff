"""Threads inside DataLoader workers: what a worker sees, and ``worker_init_fn`` to limit them.

A worker whose libraries each start one thread per CPU (OpenMP, MKL/OpenBLAS, OpenCV) turns
``num_workers=N`` into ``N × CPUs`` busy threads fighting for ``CPUs`` cores. PyTorch sets its own
intra-op threads to 1 in workers, but not the others. ``worker_init_fn`` sets them all.

Example::

    loader = DataLoader(ds, num_workers=8, worker_init_fn=packer.worker_init_fn)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from packer.core.cpus import available_cpus
from packer.diagnosis.io_counters import process_threads
from packer.errors import PackerError

__all__ = [
    "THREAD_ENV",
    "ThreadReport",
    "limit_threads",
    "make_worker_init_fn",
    "thread_report",
    "worker_init_fn",
    "worker_thread_report",
]

THREAD_ENV = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
)


def limit_threads(threads: int = 1) -> dict[str, Any]:
    """Limit the thread pools of this process to ``threads``; return what was set.

    Sets torch's intra-op threads, the OpenMP/MKL/OpenBLAS environment variables (read by
    libraries initialised after this call), threadpoolctl's limits when it is installed (which
    reaches pools already started) and OpenCV's when ``cv2`` has been imported.
    """
    done: dict[str, Any] = {}
    for name in THREAD_ENV:
        os.environ[name] = str(threads)
    done["env"] = list(THREAD_ENV)
    torch.set_num_threads(threads)
    done["torch"] = threads
    if importlib.util.find_spec("threadpoolctl") is not None:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
        done["threadpoolctl"] = threads
    cv2 = sys.modules.get("cv2")
    if cv2 is not None:
        cv2.setNumThreads(threads)
        done["cv2"] = threads
    return done


def worker_init_fn(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn`` that limits every thread pool of the worker to one thread.

    Args:
        worker_id: the worker's number (unused; the DataLoader passes it).
    """
    limit_threads(1)


class _ChainedInit:
    """Picklable ``worker_init_fn``: limit threads, then call the user's own function."""

    def __init__(self, threads: int, then: Callable[[int], Any] | None) -> None:
        self.threads = threads
        self.then = then

    def __call__(self, worker_id: int) -> None:
        limit_threads(self.threads)
        if self.then is not None:
            self.then(worker_id)


def make_worker_init_fn(
    threads: int = 1, then: Callable[[int], Any] | None = None
) -> Callable[[int], None]:
    """A ``worker_init_fn`` limiting threads to ``threads`` and then calling ``then(worker_id)``."""
    return _ChainedInit(threads, then)


@dataclass
class ThreadReport:
    """Thread pools as one process sees them."""

    pid: int
    cpus: int
    os_threads: int | None
    torch_threads: int
    torch_interop_threads: int
    env: dict[str, str | None] = field(default_factory=dict)
    opencv_threads: int | None = None

    @property
    def largest_pool(self) -> int:
        """The largest thread pool a library may start in this process."""
        sizes = [self.torch_threads, self.opencv_threads or 1]
        for value in self.env.values():
            sizes.append(int(value) if value and value.isdigit() else self.cpus)
        return max(sizes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict, ``largest_pool`` included."""
        return {**asdict(self), "largest_pool": self.largest_pool}


def thread_report() -> ThreadReport:
    """The thread pools of the calling process (an unset OMP/MKL variable means one per CPU)."""
    cv2 = sys.modules.get("cv2")
    return ThreadReport(
        pid=os.getpid(),
        cpus=available_cpus(),
        os_threads=process_threads(),
        torch_threads=torch.get_num_threads(),
        torch_interop_threads=torch.get_num_interop_threads(),
        env={name: os.environ.get(name) for name in THREAD_ENV[:3]},
        opencv_threads=int(cv2.getNumThreads()) if cv2 is not None else None,
    )


class _Probe(Dataset):
    """One item: read a sample of ``dataset`` (so its libraries start), then report threads."""

    def __init__(self, dataset: Dataset | None) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return 1

    def __getitem__(self, i: int) -> ThreadReport:
        n = 0 if self.dataset is None else len(self.dataset)  # type: ignore[arg-type]
        for j in range(min(n, 8)):  # the first sample that decodes starts the libraries
            try:
                self.dataset[j]  # type: ignore[index]
                break
            except (PackerError, OSError, ValueError):
                continue
        return thread_report()


def worker_thread_report(
    dataset: Dataset | None = None,
    worker_init: Callable[[int], Any] | None = None,
    multiprocessing_context: str | None = None,
) -> ThreadReport:
    """Thread pools as a DataLoader worker sees them, after it has read one sample of ``dataset``."""
    loader = DataLoader(
        _Probe(dataset),
        batch_size=None,
        num_workers=1,
        worker_init_fn=worker_init,
        multiprocessing_context=multiprocessing_context,
    )
    report: ThreadReport = next(iter(loader))
    return report
