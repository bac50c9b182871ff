"""Which frames of a video make a clip: pure functions, no I/O.

Every function returns ``num_frames`` frame indices as an int64 array, each in
``[0, total)`` and in non-decreasing order, for any ``total >= 1``:

- ``uniform``: the centre frame of each of ``num_frames`` equal segments. Deterministic: the
  evaluation default.
- ``random``: a contiguous window of ``num_frames`` frames ``stride`` apart, starting at a
  random frame. When the window does not fit, the stride shrinks to the largest that fits.
- ``segments`` (TSN): one random frame from each of ``num_frames`` equal segments.

Short videos (fewer frames than ``num_frames``) are padded by repeating frames: every frame is
used and each is repeated about ``num_frames / total`` times, in order (e.g. 3 frames, 8 wanted:
``0 0 0 1 1 1 2 2`` for ``random``), so the clip still plays forward.

Randomness comes from a ``numpy.random.Generator``; :func:`clip_rng` derives one from
``(seed, epoch, index)`` so a seeded dataset gives the same clips for the same epoch.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "SAMPLINGS",
    "clip_indices",
    "clip_rng",
    "random_indices",
    "segment_indices",
    "stretch_indices",
    "uniform_indices",
]

SAMPLINGS = ("uniform", "random", "segments")


def _check(total: int, num_frames: int) -> None:
    if total < 1:
        raise ValueError(f"a video needs at least 1 frame, got total={total}")
    if num_frames < 1:
        raise ValueError(f"num_frames must be >= 1, got {num_frames}")


def stretch_indices(total: int, num_frames: int) -> np.ndarray:
    """``floor(i * total / num_frames)``: every frame of a short video, repeated evenly."""
    _check(total, num_frames)
    return np.arange(num_frames, dtype=np.int64) * total // num_frames


def uniform_indices(total: int, num_frames: int) -> np.ndarray:
    """The centre frame of each of ``num_frames`` equal segments of ``total`` frames."""
    _check(total, num_frames)
    return (2 * np.arange(num_frames, dtype=np.int64) + 1) * total // (2 * num_frames)


def random_indices(
    total: int, num_frames: int, rng: np.random.Generator, stride: int = 1
) -> np.ndarray:
    """A random contiguous window: ``start + stride * arange(num_frames)``.

    The stride shrinks to the largest that fits when the window is longer than the video;
    a video shorter than ``num_frames`` is stretched (see :func:`stretch_indices`).
    """
    _check(total, num_frames)
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    if total < num_frames:
        return stretch_indices(total, num_frames)
    if num_frames > 1:
        stride = min(stride, (total - 1) // (num_frames - 1))
    span = (num_frames - 1) * stride + 1
    start = int(rng.integers(0, total - span + 1))
    return start + stride * np.arange(num_frames, dtype=np.int64)


def segment_indices(total: int, num_frames: int, rng: np.random.Generator) -> np.ndarray:
    """TSN sampling: one random frame from each of ``num_frames`` equal segments.

    Segment ``i`` is ``[floor(i * total / n), floor((i + 1) * total / n))``; an empty segment
    (a video shorter than ``num_frames``) contributes its start frame, which repeats a frame.
    """
    _check(total, num_frames)
    bounds = np.arange(num_frames + 1, dtype=np.int64) * total // num_frames
    starts, ends = bounds[:-1], bounds[1:]
    widths = np.maximum(ends - starts, 1)
    return starts + (rng.random(num_frames) * widths).astype(np.int64).clip(0, widths - 1)


def clip_indices(
    total: int,
    num_frames: int,
    sampling: str = "uniform",
    rng: np.random.Generator | None = None,
    stride: int = 1,
) -> np.ndarray:
    """The frame indices of one clip of ``num_frames`` from a video of ``total`` frames.

    Args:
        total: frames in the video (>= 1).
        num_frames: frames in the clip (>= 1).
        sampling: ``"uniform"``, ``"random"`` or ``"segments"``.
        rng: random source for ``random`` and ``segments`` (default: a fresh unseeded one).
        stride: frame step of the ``random`` window.

    Raises:
        ValueError: an unknown sampling or a non-positive count.
    """
    if sampling == "uniform":
        return uniform_indices(total, num_frames)
    if sampling not in SAMPLINGS:
        raise ValueError(f"unknown sampling {sampling!r}; expected one of {', '.join(SAMPLINGS)}")
    rng = rng if rng is not None else np.random.default_rng()
    if sampling == "random":
        return random_indices(total, num_frames, rng, stride)
    return segment_indices(total, num_frames, rng)


def clip_rng(seed: int | None, epoch: int, index: int) -> np.random.Generator:
    """A generator for one item: reproducible from ``(seed, epoch, index)``; fresh if no seed."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, int(epoch), int(index)])
