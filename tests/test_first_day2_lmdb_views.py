"""Issue 42 item 1: several datasets over one LMDB in one process, with any mix of options
(readahead, fields, output), share its environments and read the right data — in the process and
in DataLoader workers under fork and spawn."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

import packer
from packer.demo.fields import make_caption_set


def _views(dst: Path) -> tuple:
    """The README's two lines plus an eval view without readahead, all over one file."""
    full = packer.open_dataset(dst, output="bytes")
    captions = packer.open_dataset(dst, fields=("txt",))
    exact = packer.open_dataset(dst, fields=("jpg",), readahead=False, output="bytes")
    return full, captions, exact


@pytest.fixture
def pairs(tmp_path: Path) -> tuple[Path, dict[str, dict[str, bytes]]]:
    written = make_caption_set(tmp_path / "pairs", 12, seed=3)
    dst = tmp_path / "pairs.lmdb"  # a fresh file per test: no environment of it is open yet
    packer.convert(tmp_path / "pairs", dst, progress=False)
    return dst, written


def _check(full: object, captions: object, exact: object, written: dict) -> None:
    n = len(written)
    assert len(full) == len(captions) == len(exact) == n  # type: ignore[arg-type]
    for i in range(n):
        sample = full[i]  # type: ignore[index]
        key = sample["__key__"]
        assert sample["jpg"] == written[key]["jpg"]
        assert captions[i] == (written[key]["txt"].decode(),)  # type: ignore[index]
        assert exact[i] == (written[key]["jpg"],)  # type: ignore[index]


def test_three_views_in_one_process_in_any_order(pairs: tuple) -> None:
    dst, written = pairs
    exact_first = packer.open_dataset(dst, readahead=False, output="bytes")
    exact_first[0]  # the environment is opened without readahead first
    full, captions, exact = _views(dst)
    _check(full, captions, exact, written)
    full2, captions2, exact2 = _views(dst)  # opened twice, as a notebook would
    _check(full2, captions2, exact2, written)


def _collate(batch: list) -> list:
    return batch


class _Three:
    """One map-style dataset that reads all three views for each index (picklable)."""

    def __init__(self, dst: Path) -> None:
        self.views = _views(dst)

    def __len__(self) -> int:
        return len(self.views[0])

    def __getitem__(self, i: int) -> tuple:
        full, captions, exact = self.views
        return full[i]["__key__"], full[i]["jpg"], captions[i], exact[i]


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_three_views_in_dataloader_workers(pairs: tuple, context: str) -> None:
    dst, written = pairs
    three = _Three(dst)
    three[0]  # the parent reads first, opening the environments here
    loader = DataLoader(
        three, batch_size=3, num_workers=2, multiprocessing_context=context, collate_fn=_collate
    )
    seen = Counter()
    for batch in loader:
        for key, jpg, caption, exact in batch:
            assert jpg == written[key]["jpg"]
            assert caption == (written[key]["txt"].decode(),)
            assert exact == (written[key]["jpg"],)
            seen[key] += 1
    assert seen == Counter(dict.fromkeys(written, 1))
