"""``--dask``: a ``distributed.Client`` for a conversion, to a running scheduler or a local cluster.

``tcp://host:8786`` (or ``host:8786``) connects to an existing scheduler whose workers see the
source and the destination on a shared file system; ``local`` or ``local:N`` starts a
``LocalCluster`` of ``N`` worker processes (default 2) with one thread each on this machine.
The client's ``submit`` is the executor :func:`packer.write.convert.convert` takes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from packer.errors import PackerError

__all__ = ["CONNECT_TIMEOUT", "dask_client", "parse_local"]

CONNECT_TIMEOUT = 10  # seconds to reach a scheduler before giving up
INSTALL = "pip install 'packer-datasets[dask]'"


def parse_local(spec: str) -> int | None:
    """The worker count of ``local`` / ``local:N`` (2 for ``local``), or None for an address."""
    if spec != "local" and not spec.startswith("local:"):
        return None
    text = spec.partition(":")[2] or "2"
    if not text.isdigit() or int(text) < 1:
        raise PackerError(f"invalid --dask {spec!r}; expected local:N with N >= 1, e.g. local:4")
    return int(text)


def _distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise PackerError(
            f"--dask needs dask.distributed, which is not installed: {INSTALL}"
        ) from exc
    return distributed


@contextmanager
def dask_client(spec: str) -> Iterator[Any]:
    """A ``distributed.Client`` for ``spec`` (closed on exit, with its local cluster if any).

    Raises:
        PackerError: dask is not installed, ``spec`` is malformed or the scheduler is
            unreachable (the message names the address and suggests ``--dask local:2``).
    """
    workers = parse_local(spec)
    distributed = _distributed()
    cluster = None
    if workers is not None:
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.ERROR,
        )
        client = distributed.Client(cluster)
    else:
        try:
            client = distributed.Client(spec, timeout=CONNECT_TIMEOUT)
        except (OSError, TimeoutError, ValueError) as exc:
            raise PackerError(
                f"cannot reach the dask scheduler at {spec!r} ({exc}). Start one there "
                "(dask scheduler; dask worker ADDRESS on each machine), or convert on this "
                "machine with --dask local:2"
            ) from exc
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
