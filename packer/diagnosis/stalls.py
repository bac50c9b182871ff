"""Per-batch wait times: summary statistics, the periodic-stall detector and the worker formula.

The classic DataLoader stall: each of the ``N`` workers builds a whole batch alone, in ``W``
seconds. The ``N`` workers start together, so their batches arrive together; the training loop
eats them in ``N`` steps of ``t`` seconds and then waits for the next round. The waits then show
one slow batch every ``N`` batches. The loop stays fed only when ``N >= W / t``.

Everything here is a pure function of the measured waits, so it is tested on synthetic data.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "FED",
    "HEADROOM",
    "Stall",
    "WaitStats",
    "WorkerAdvice",
    "advise_workers",
    "batch_build_seconds",
    "detect_stall",
    "describe_stall",
    "recommend_workers",
    "wait_stats",
]

HEADROOM = 1.25  # build batches 25 % faster than the loop eats them: jitter, slow samples
FED = 0.05  # the loop counts as fed when it waits at most this share of the time
MIN_CPU_SHARE = 0.05  # workers beyond the CPUs: at most cpus / this (20 per CPU)


@dataclass
class WaitStats:
    """Summary of the time the loop waited for each batch (milliseconds)."""

    count: int
    p50_ms: float
    p95_ms: float
    max_ms: float
    mean_ms: float
    total_s: float

    def to_dict(self) -> dict[str, float]:
        """Plain dict."""
        return asdict(self)


def wait_stats(waits: Sequence[float]) -> WaitStats:
    """p50 / p95 / max / mean of per-batch waits given in seconds."""
    if len(waits) == 0:
        return WaitStats(0, 0.0, 0.0, 0.0, 0.0, 0.0)
    ms = np.asarray(waits, dtype=np.float64) * 1e3
    return WaitStats(
        count=len(ms),
        p50_ms=float(np.percentile(ms, 50)),
        p95_ms=float(np.percentile(ms, 95)),
        max_ms=float(ms.max()),
        mean_ms=float(ms.mean()),
        total_s=float(ms.sum() / 1e3),
    )


@dataclass
class Stall:
    """What the detector found in a sequence of waits.

    Attributes:
        kind: ``"periodic"`` (a slow batch every ``period`` batches), ``"irregular"`` (slow
            batches without a period) or ``"none"`` (no batch stands out).
        period: batches between two slow ones, for ``"periodic"``; otherwise None.
        slow: how many of the analysed batches are slow.
        analysed: how many batches were analysed (the first ``skip`` are left out).
        slow_ms: median wait of the slow batches.
        fast_ms: median wait of the other batches.
        regularity: share of the gaps between slow batches equal to ``period``.
        slow_batches: indices (in the full sequence) of the slow batches.
    """

    kind: str
    period: int | None
    slow: int
    analysed: int
    slow_ms: float
    fast_ms: float
    regularity: float
    slow_batches: list[int]

    def to_dict(self) -> dict[str, object]:
        """Plain dict."""
        return asdict(self)


def _otsu_split(values: np.ndarray) -> float:
    """The threshold that best splits sorted ``values`` into a low and a high group."""
    n = len(values)
    cum = np.cumsum(values)
    k = np.arange(1, n)
    mean_low = cum[:-1] / k
    mean_high = (cum[-1] - cum[:-1]) / (n - k)
    between = k * (n - k) * (mean_high - mean_low) ** 2
    best = int(np.argmax(between)) + 1
    return float((values[best - 1] + values[best]) / 2)


def detect_stall(
    waits: Sequence[float],
    skip: int = 1,
    min_ratio: float = 3.0,
    min_gap_ms: float = 1.0,
    min_regularity: float = 0.7,
) -> Stall:
    """Find slow batches in per-batch waits (seconds) and the period they repeat with.

    Args:
        waits: the wait of each batch, in loop order.
        skip: leading batches to leave out (the first includes worker start-up).
        min_ratio: slow batches must wait this many times longer than the others (medians)...
        min_gap_ms: ... and at least this many milliseconds longer.
        min_regularity: share of gaps between slow batches that must equal the period.
    """
    ms = np.asarray(waits, dtype=np.float64)[skip:] * 1e3
    none = Stall("none", None, 0, len(ms), 0.0, float(np.median(ms)) if len(ms) else 0.0, 0.0, [])
    if len(ms) < 4 or float(ms.max() - ms.min()) <= 0.0:
        return none
    threshold = _otsu_split(np.sort(ms))
    high, low = ms[ms > threshold], ms[ms <= threshold]
    slow_ms, fast_ms = float(np.median(high)), float(np.median(low))
    if slow_ms < min_ratio * fast_ms or slow_ms - fast_ms < min_gap_ms:
        return none
    where = np.flatnonzero(ms > threshold)
    slow_batches = [int(i) + skip for i in where]
    gaps = np.diff(where)
    kind, period, regularity = "irregular", None, 0.0
    if len(gaps) >= 2:
        gap, count = Counter(int(g) for g in gaps).most_common(1)[0]
        regularity = count / len(gaps)
        if gap >= 2 and regularity >= min_regularity:
            kind, period = "periodic", gap
    return Stall(kind, period, len(where), len(ms), slow_ms, fast_ms, regularity, slow_batches)


def batch_build_seconds(
    waits: Sequence[float], step_s: float, num_workers: int, skip: int = 1
) -> float:
    """Estimate ``W``, the time one worker takes to build one batch, from the loop's waits.

    With ``N`` workers busy all the time the loop receives ``N`` batches every ``W`` seconds, so
    ``W = N × mean(wait + step)``. With ``num_workers=0`` the main process builds each batch
    inside ``next()``, so ``W = mean(wait)``. When the loop hardly waits the workers are not
    busy all the time and this is an upper bound.
    """
    steady = np.asarray(waits, dtype=np.float64)[skip:]
    if len(steady) == 0:
        steady = np.asarray(waits, dtype=np.float64)
    if len(steady) == 0:
        return 0.0
    if num_workers <= 0:
        return float(steady.mean())
    return float(num_workers * (steady.mean() + step_s))


def recommend_workers(batch_s: float, step_s: float, headroom: float = HEADROOM) -> int:
    """Workers that keep a loop of ``step_s`` fed when one worker builds a batch in ``batch_s``.

    ``ceil(headroom × W / t)``, at least 1: each worker delivers one batch per ``W``, the loop
    wants one per ``t``.
    """
    if step_s <= 0:
        raise ValueError(f"step time must be positive, got {step_s}")
    return max(1, math.ceil(headroom * batch_s / step_s - 1e-9))


def describe_stall(stall: Stall, num_workers: int) -> str:
    """The stall in words, for a report."""
    if stall.kind == "none":
        return (
            f"no batch stands out: the waits are uniform (median {stall.fast_ms:.1f} ms over "
            f"{stall.analysed} batches)."
        )
    head = (
        f"{stall.slow} of {stall.analysed} batches are slow (median {stall.slow_ms:.1f} ms "
        f"against {stall.fast_ms:.1f} ms for the others)"
    )
    if stall.kind == "irregular":
        return head + ", without a period: look at storage latency or a few slow samples."
    text = f"{head}, one every {stall.period} batches ({100 * stall.regularity:.0f} % regular)."
    if num_workers > 0 and stall.period == num_workers:
        text += (
            f" The period equals the {num_workers} workers: each worker builds a whole batch"
            " alone, the workers finish their batches together, the loop eats them in"
            f" {num_workers} quick steps and then waits for the next round. The loop stays fed"
            " only when num_workers >= W / t (W: time for one worker to build a batch, t: step)."
        )
    return text


@dataclass
class WorkerAdvice:
    """The one ``num_workers`` a report recommends, and the one line of reasoning behind it.

    Attributes:
        workers: the recommendation.
        reason: why, in one line (the formula with its measured numbers).
        batch_ms: the time one worker takes to build one batch, that the formula used.
        needed: ``ceil(headroom × batch_ms / step_ms)`` before any clamp (None without a step).
    """

    workers: int
    reason: str
    batch_ms: float
    needed: int | None

    def to_dict(self) -> dict[str, object]:
        """Plain dict."""
        return asdict(self)

    def __str__(self) -> str:
        return f"num_workers={self.workers}: {self.reason}"


def _fed_advice(
    current: int, needed: int, waited: str, formula: str, cpus: int, batch_ms: float, label: str
) -> WorkerAdvice:
    """The loop is fed with ``current`` workers: keep them, or fewer when the cost says so."""
    if current == 0 or needed >= current:
        reason = f"{label} {current} is enough: the loop waited only {waited} of the time"
        workers = current
    else:
        reason = f"fewer suffice: the loop waited only {waited} with {current}, and {formula}"
        workers = needed
    if workers > cpus:
        reason += f" (above the {cpus} CPUs, but measured to keep the loop fed)"
    return WorkerAdvice(workers, reason, batch_ms, needed)


def _above_cpus(
    needed: int, formula: str, cpus: int, cpu_share: float | None, batch_ms: float
) -> WorkerAdvice:
    """``needed`` workers exceed the CPUs: allowed only as far as samples wait rather than
    compute (``cpu_share``: CPU time / wall time of a sample), and said why either way."""
    share = 1.0 if cpu_share is None else min(1.0, max(cpu_share, MIN_CPU_SHARE))
    cap = max(cpus, math.floor(cpus / share))
    if needed <= cap:
        reason = (
            f"{formula}; above the {cpus} CPUs because a sample computes only"
            f" {100 * share:.0f} % of the time it takes and waits (disk, network, sleep) the rest"
        )
        return WorkerAdvice(needed, reason, batch_ms, needed)
    if cap == cpus:
        why = f"more than the {cpus} CPUs, which more workers would only share"
    else:
        why = (
            f"more than the {cap} workers {cpus} CPUs keep busy when a sample computes"
            f" {100 * share:.0f} % of its time"
        )
    reason = (
        f"{formula}, {why}: make samples cheaper (pack the data, smaller images, a faster decoder)"
    )
    return WorkerAdvice(cap, reason, batch_ms, needed)


def advise_workers(
    batch_ms: float,
    step_ms: float | None,
    cpus: int,
    current: int | None = None,
    wait_fraction: float | None = None,
    headroom: float = HEADROOM,
    cost: str = "measured",
    label: str = "your current",
    cpu_share: float | None = None,
) -> WorkerAdvice:
    """The one ``num_workers`` recommendation of ``packer doctor`` and :func:`packer.diagnose`.

    Each worker builds a whole batch in ``batch_ms``; the loop wants one every ``step_ms``, so
    ``W = ceil(headroom × batch_ms / step_ms)``, at least 1, at most ``cpus`` (more workers than
    CPUs only share them) unless samples mostly wait rather than compute (``cpu_share``). A loop measured as fed (``wait_fraction <= FED`` with ``current``
    workers) keeps ``current``, or ``W`` when the cost says fewer suffice. Without a step time:
    one worker per CPU, the most this machine can load.

    Args:
        batch_ms: one worker building one batch (per-sample cost × batch size).
        step_ms: the training step (None or 0: as fast as possible).
        cpus: CPUs this process may use.
        current: the workers of a measured run, if any.
        wait_fraction: the share of time that run's loop waited.
        headroom: factor on ``batch_ms / step_ms`` for jitter and slow samples.
        cost: how ``batch_ms`` was obtained, for the reason.
        label: how the reason names ``current`` ("your current 2 is enough").
        cpu_share: CPU time / wall time of one sample (None: all CPU). Samples that mostly wait
            (storage latency) may use more workers than CPUs: up to ``cpus / cpu_share``.
    """
    cpus = max(1, cpus)
    if not step_ms or step_ms <= 0:
        feeds = headroom * batch_ms / cpus
        reason = (
            f"no step time given: one worker per CPU loads as fast as this machine can; a batch"
            f" takes {batch_ms:.1f} ms to build ({cost}), so {cpus} workers feed a step of"
            f" {feeds:.1f} ms or longer (give the step time for the count it needs)"
        )
        return WorkerAdvice(cpus, reason, batch_ms, None)
    needed = max(1, math.ceil(headroom * batch_ms / step_ms - 1e-9))
    formula = (
        f"one worker builds a batch in {batch_ms:.1f} ms ({cost}) and the step takes"
        f" {step_ms:g} ms: ceil({headroom:g} × {batch_ms:.1f} / {step_ms:g}) = {needed}"
    )
    if current is not None and wait_fraction is not None:
        waited = f"{100 * wait_fraction:.0f} %"
        if wait_fraction <= FED:
            return _fed_advice(current, needed, waited, formula, cpus, batch_ms, label)
    if needed > cpus:
        return _above_cpus(needed, formula, cpus, cpu_share, batch_ms)
    reason = formula
    if current is not None and wait_fraction is not None and needed <= current:
        reason += (
            f"; the loop still waited {100 * wait_fraction:.0f} % of the time with {current}:"
            " the workers compete for the CPUs or the disk"
        )
    return WorkerAdvice(needed, reason, batch_ms, needed)
