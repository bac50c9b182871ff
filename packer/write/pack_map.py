"""The inputs of :func:`packer.pack` run in order or in parallel, their outcomes handed back in
input order whatever the number of workers (so the output bytes do not depend on it).

Inputs go out in chunks of consecutive positions. In this process (``workers=1``); to a pool of
``workers`` processes, which receive the inputs and the spec once, when they start (nothing is
pickled under fork); or to an ``executor`` (anything with ``submit``: a ``distributed.Client``, a
process pool), each task carrying its chunk's inputs (or the whole Dataset). At most a few
chunks per worker are in flight, so memory holds a bounded window of outcomes.
"""

from __future__ import annotations

import multiprocessing
import pickle
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from packer.errors import PackerError
from packer.write.pack_inputs import Outcome, PackSpec, run_input

__all__ = ["chunk_size", "outcomes"]

_AHEAD = 3  # chunks in flight per worker
_STATE: tuple[Sequence[Any], PackSpec] | None = None  # a pool worker's inputs and spec


def chunk_size(count: int, workers: int) -> int:
    """Inputs per task: enough to amortise a task's cost, few enough to spread the work."""
    return max(1, min(32, count // max(1, workers * 16)))


def _run_range(
    inputs: Sequence[Any], spec: PackSpec, start: int, stop: int, offset: int = 0
) -> list[Outcome]:
    return [run_input(inputs, index, spec, offset) for index in range(start, stop)]


def _init(inputs: Sequence[Any], spec: PackSpec) -> None:
    global _STATE
    _STATE = (inputs, spec)


def _pool_task(start: int, stop: int) -> list[Outcome]:
    assert _STATE is not None, "a pack worker started without its inputs"
    return _run_range(_STATE[0], _STATE[1], start, stop)


def _executor_task(
    items: Sequence[Any], offset: int, spec: PackSpec, start: int, stop: int
) -> list[Outcome]:
    """A task on an executor: ``items`` hold positions ``offset ...`` of the inputs."""
    return _run_range(items, spec, start, stop, offset)


def _check_picklable(spec: PackSpec, inputs: Any, whole: bool) -> None:
    what = "fn" if spec.fn is not None else "the spec"
    try:
        pickle.dumps(spec)
        if whole:
            pickle.dumps(inputs)
    except Exception as exc:  # noqa: BLE001 - any pickling failure is the same advice
        thing = what if whole is False else f"{what} or the inputs"
        raise PackerError(
            f"{thing} cannot be sent to worker processes ({type(exc).__name__}: {exc}): define "
            "fn at module level (a lambda or a local function does not pickle), or use "
            "workers=1"
        ) from None


def _in_order(
    submit: Any, ranges: list[tuple[int, int]], window: int, args_of: Any
) -> Iterator[Outcome]:
    pending: deque[Future[list[Outcome]]] = deque()
    queued = iter(ranges)
    for _ in range(window):
        nxt = next(queued, None)
        if nxt is None:
            break
        pending.append(submit(*args_of(*nxt)))
    while pending:
        done = pending.popleft().result()
        nxt = next(queued, None)
        if nxt is not None:
            pending.append(submit(*args_of(*nxt)))
        yield from done


def outcomes(
    inputs: Sequence[Any],
    spec: PackSpec,
    start: int = 0,
    workers: int = 1,
    executor: Any = None,
    stop: int | None = None,
) -> Iterator[Outcome]:
    """The outcome of every input from position ``start`` to ``stop`` (default: the end), in
    input order.

    Raises:
        PackerError: ``fn`` or the inputs cannot be sent to the workers, or a worker process
            died (killed, out of memory): the message says to resume.
    """
    count = len(inputs) if stop is None else stop
    step = chunk_size(count - start, max(workers, 2 if executor is not None else 1))
    ranges = [(a, min(a + step, count)) for a in range(start, count, step)]
    if executor is None and workers <= 1:
        for a, b in ranges:
            yield from _run_range(inputs, spec, a, b)
        return
    if executor is not None:
        plain = isinstance(inputs, list | tuple | range)
        _check_picklable(spec, inputs, whole=not plain)

        def args_of(a: int, b: int) -> tuple[Any, ...]:
            if plain:
                return (_executor_task, list(inputs[a:b]), a, spec, a, b)
            return (_executor_task, inputs, 0, spec, a, b)

        yield from _in_order(executor.submit, ranges, _AHEAD * max(workers, 2), args_of)
        return
    context = multiprocessing.get_context()
    if context.get_start_method() != "fork":
        _check_picklable(spec, inputs, whole=True)
    pool = ProcessPoolExecutor(workers, context, initializer=_init, initargs=(inputs, spec))
    try:
        yield from _in_order(pool.submit, ranges, _AHEAD * workers, lambda a, b: (_pool_task, a, b))
    except BrokenProcessPool as exc:
        raise PackerError(
            f"a pack worker process died ({exc}): killed, or out of memory? What was written "
            "is kept in DST.partial: run again with resume=True (--resume) to continue"
        ) from None
    finally:  # a run stopped early (strict, an error) does not wait for the chunks in flight
        pool.shutdown(wait=True, cancel_futures=True)
