"""Clip sampling: property tests over frame counts 1..500 for every mode."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.read.clip_frames import (
    SAMPLINGS,
    clip_indices,
    clip_rng,
    random_indices,
    segment_indices,
    uniform_indices,
)

totals = st.integers(min_value=1, max_value=500)
lengths = st.integers(min_value=1, max_value=64)
strides = st.integers(min_value=1, max_value=8)
seeds = st.integers(min_value=0, max_value=2**32 - 1)


@settings(max_examples=300, deadline=None)
@given(
    total=totals,
    num_frames=lengths,
    stride=strides,
    seed=seeds,
    sampling=st.sampled_from(SAMPLINGS),
)
def test_indices_in_range_ordered_and_full_length(
    total: int, num_frames: int, stride: int, seed: int, sampling: str
) -> None:
    idx = clip_indices(total, num_frames, sampling, np.random.default_rng(seed), stride)
    assert idx.dtype == np.int64
    assert len(idx) == num_frames
    assert idx.min() >= 0 and idx.max() < total
    assert np.all(np.diff(idx) >= 0)


@settings(max_examples=200, deadline=None)
@given(total=totals, num_frames=lengths, seed=seeds, sampling=st.sampled_from(SAMPLINGS))
def test_long_videos_never_repeat_a_frame(
    total: int, num_frames: int, seed: int, sampling: str
) -> None:
    idx = clip_indices(total, num_frames, sampling, np.random.default_rng(seed))
    if total >= num_frames:
        assert np.all(np.diff(idx) > 0)
    else:  # short videos: every frame used, repeated in order
        assert set(idx.tolist()) == set(range(total))


@settings(max_examples=200, deadline=None)
@given(total=totals, num_frames=lengths, stride=strides, seed=seeds)
def test_random_window_is_contiguous_with_stride(
    total: int, num_frames: int, stride: int, seed: int
) -> None:
    idx = random_indices(total, num_frames, np.random.default_rng(seed), stride)
    if total >= (num_frames - 1) * stride + 1 and num_frames > 1:
        assert set(np.diff(idx).tolist()) == {stride}


@settings(max_examples=200, deadline=None)
@given(total=totals, num_frames=lengths, seed=seeds)
def test_segments_take_one_frame_per_segment(total: int, num_frames: int, seed: int) -> None:
    idx = segment_indices(total, num_frames, np.random.default_rng(seed))
    bounds = np.arange(num_frames + 1) * total // num_frames
    for i, frame in enumerate(idx):
        assert bounds[i] <= frame < max(bounds[i + 1], bounds[i] + 1)


def test_uniform_is_deterministic_and_centred() -> None:
    assert uniform_indices(80, 8).tolist() == [5, 15, 25, 35, 45, 55, 65, 75]
    assert uniform_indices(3, 6).tolist() == [0, 0, 1, 1, 2, 2]
    assert clip_indices(80, 8).tolist() == uniform_indices(80, 8).tolist()


def test_seeded_rng_reproducible_per_epoch_and_index() -> None:
    def draw(epoch: int, index: int) -> list[int]:
        return clip_indices(300, 8, "segments", clip_rng(7, epoch, index)).tolist()

    assert draw(0, 3) == draw(0, 3)
    assert draw(0, 3) != draw(1, 3)
    assert draw(0, 3) != draw(0, 4)


@pytest.mark.parametrize(
    ("args", "message"),
    [((0, 8), "at least 1 frame"), ((10, 0), "num_frames"), ((10, 8, "bogus"), "unknown sampling")],
)
def test_bad_arguments(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        clip_indices(*args)
