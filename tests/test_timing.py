"""The one timing loop: passes, steps over several epochs, simulated steps, time limit, hooks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader

from packer.diagnosis import timing as timing_module
from packer.diagnosis.timing import Throughput, measure_throughput, median_run, time_batches
from packer.errors import PackerError


class CountedClock:
    """The real clock for :mod:`packer.diagnosis.timing`, each of its sleeps recorded: a step is an
    event counted, not a time compared."""

    perf_counter = staticmethod(time.perf_counter)

    def __init__(self) -> None:
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        time.sleep(seconds)


def test_one_pass_times_every_batch() -> None:
    timing = time_batches([1, 2, 3])
    assert len(timing.waits) == 3 and timing.epochs == 1
    assert min(timing.waits) >= 0 and timing.seconds >= sum(timing.waits)


def test_steps_run_over_several_epochs_and_stop_exactly() -> None:
    seen: list[Any] = []
    timing = time_batches([1, 2, 3], steps=7, on_batch=lambda batch, _: seen.append(batch))
    assert seen == [1, 2, 3, 1, 2, 3, 1] and len(timing.waits) == 7 and timing.epochs == 3


def test_step_sleep_follows_every_batch_but_the_last_step(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = CountedClock()
    monkeypatch.setattr(timing_module, "time", clock)
    timing = time_batches(range(3), step_s=0.01)  # one pass: a step after each of 3 batches
    assert clock.sleeps == [0.01] * 3 and timing.seconds >= 0.03
    clock.sleeps.clear()
    timing = time_batches(range(3), steps=2, step_s=0.05)  # stops before the second step
    assert clock.sleeps == [0.05] and len(timing.waits) == 2 and timing.seconds >= 0.05


def test_wait_measures_the_time_inside_next() -> None:
    def slow() -> Iterator[int]:
        for i in range(3):
            time.sleep(0.02)
            yield i

    timing = time_batches(slow())
    assert all(w >= 0.015 for w in timing.waits)


def test_time_limit_stops_early() -> None:
    def forever() -> Iterator[int]:
        while True:
            time.sleep(0.01)
            yield 0

    timing = time_batches(forever(), time_limit_s=0.05)
    # each batch takes >= 10 ms: the 6th at the latest ends past 50 ms (a count, whatever the load)
    assert 1 <= len(timing.waits) <= 6 and timing.epochs == 1


def test_empty_loader_with_steps_is_an_error() -> None:
    assert time_batches([]).waits == []  # one pass over nothing is just empty
    with pytest.raises(PackerError, match="no batch"):
        time_batches([], steps=3)


def test_on_batch_gets_the_iterator_of_a_dataloader() -> None:
    iterators: list[Any] = []
    loader = DataLoader(list(range(8)), batch_size=4)
    time_batches(loader, on_batch=lambda _, it: iterators.append(it))
    assert len(iterators) == 2 and iterators[0] is iterators[1]


def test_measure_throughput_counts_samples_and_bytes() -> None:
    data = [(b"x" * 10, 0)] * 9
    run = measure_throughput(data, batch_size=4)  # type: ignore[arg-type]
    assert (run.images, run.bytes) == (9, 90) and run.seconds > 0
    run = measure_throughput(data, batch_size=4, sampler=[0, 1, 2])  # type: ignore[arg-type]
    assert (run.images, run.bytes) == (3, 30)


def test_median_run() -> None:
    runs = [Throughput(1, 1, s) for s in (3.0, 1.0, 2.0)]
    assert median_run(runs).seconds == 2.0
    assert median_run(runs[:2] + [Throughput(1, 1, 2.5)]).seconds == 2.5
