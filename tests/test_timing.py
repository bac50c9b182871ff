"""The one timing loop: passes, steps over several epochs, simulated steps, time limit, hooks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader

from packer.diagnosis import timing as timing_module
from packer.diagnosis.timing import Throughput, measure_throughput, median_run, time_batches
from packer.errors import PackerError


class FakeClock:
    """A clock for :mod:`packer.diagnosis.timing` that moves only when told: a sleep moves it
    by its length (and is recorded), a batch by what :meth:`takes` says. Every time the loop
    measures is then exact, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def takes(self, seconds: list[float]) -> Iterator[int]:
        """Batches 0, 1, ..., batch ``i`` taking ``seconds[i]`` inside ``next()``."""
        for i, s in enumerate(seconds):
            self.now += s
            yield i


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing_module, "time", fake)
    return fake


def test_one_pass_times_every_batch(clock: FakeClock) -> None:
    timing = time_batches(clock.takes([1.0, 2.0, 0.5]))
    assert timing.waits == [1.0, 2.0, 0.5] and timing.epochs == 1
    assert timing.seconds == 3.5 and clock.sleeps == []


def test_one_pass_through_a_real_dataloader() -> None:
    """The real clock: every wait measured, none negative (no bound on how long they took)."""
    timing = time_batches(DataLoader(list(range(12)), batch_size=4))
    assert len(timing.waits) == 3 and min(timing.waits) >= 0 and timing.epochs == 1


def test_steps_run_over_several_epochs_and_stop_exactly() -> None:
    seen: list[Any] = []
    timing = time_batches([1, 2, 3], steps=7, on_batch=lambda batch, _: seen.append(batch))
    assert seen == [1, 2, 3, 1, 2, 3, 1] and len(timing.waits) == 7 and timing.epochs == 3


def test_step_sleep_follows_every_batch_but_the_last_step(clock: FakeClock) -> None:
    timing = time_batches(range(3), step_s=0.25)  # one pass: a step after each of 3 batches
    assert clock.sleeps == [0.25] * 3 and timing.seconds == 0.75
    assert timing.waits == [0.0, 0.0, 0.0]  # the steps are not in the waits
    clock.sleeps.clear()
    timing = time_batches(range(3), steps=2, step_s=0.5)  # stops before the second step
    assert clock.sleeps == [0.5] and len(timing.waits) == 2 and timing.seconds == 0.5


def test_wait_measures_the_time_inside_next(clock: FakeClock) -> None:
    timing = time_batches(clock.takes([0.25, 0.5, 0.125]), step_s=1.0)
    assert timing.waits == [0.25, 0.5, 0.125]  # each next(), not the steps between them
    assert timing.seconds == 0.875 + 3 * 1.0


def test_time_limit_stops_early(clock: FakeClock) -> None:
    def forever() -> Iterator[int]:
        while True:
            clock.now += 1.0
            yield 0

    timing = time_batches(forever(), time_limit_s=5.0)
    # batch k ends at k seconds: the 6th is the first past the limit, and the last timed
    assert len(timing.waits) == 6 and timing.epochs == 1 and timing.seconds == 6.0
    timing = time_batches(forever(), steps=100, time_limit_s=2.5)  # the limit before the steps
    assert len(timing.waits) == 3


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
