"""``packer.pack``: the user's function over any inputs, in parallel, in order, skip-and-list.

Every output is read back through ``open_dataset``; byte identity across worker counts and
executors is checked file by file (the manifest up to its ``created`` time).
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import packer
from packer.cli.app import main


def sample_of(i: int) -> dict[str, Any] | None:
    """A module-level fn (picklable): an array, a caption, a class; input 3 fails, 5 is left out."""
    if i == 3:
        raise ValueError("three is broken")
    if i == 5:
        return None
    return {"npy": np.arange(i, dtype=np.float32).reshape(-1, 1), "txt": f"caption {i}", "cls": i}


def two_of(i: int) -> list[dict[str, Any]]:
    return [{"txt": f"{i}-a"}, {"txt": f"{i}-b"}]


def dies(i: int) -> dict[str, Any]:
    if i == 7:
        os._exit(3)  # a worker killed (out of memory, say)
    return {"txt": f"{i:040d}"}


def not_a_sample(i: int) -> str:
    return "oops"


class Pictures(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """A map-style Dataset of (uint8 image, label) tuples, as a user's own one."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        rng = np.random.default_rng(i)
        return rng.integers(0, 255, (12, 16, 3), dtype=np.uint8), i % 4


def test_workers_one_and_two_and_an_executor_write_the_same_bytes(
    tmp_path: Path, tree_files: Any
) -> None:
    outs = []
    for name, kw in (("one", {"workers": 1}), ("two", {"workers": 2})):
        out = tmp_path / f"{name}.lmdb"
        packer.pack(range(40), out, sample_of, shard_size="400B", progress=False, **kw)
        outs.append(tree_files(out))
    with ProcessPoolExecutor(2) as pool:
        out = tmp_path / "pool.lmdb"
        packer.pack(range(40), out, sample_of, shard_size="400B", progress=False, executor=pool)
        outs.append(tree_files(out))
    assert len([n for n in outs[0] if n.startswith("shard-")]) > 5  # many shards
    assert outs[0] == outs[1] == outs[2]


def test_samples_read_back_in_input_order_with_skips_listed(tmp_path: Path) -> None:
    out = tmp_path / "out.npy"
    result = packer.pack(list(range(12)), out, sample_of, workers=2, progress=False)
    ds = packer.open_dataset(out)
    assert len(ds) == 10
    expected = [i for i in range(12) if i not in (3, 5)]
    for position, i in enumerate(expected):
        s = ds[position]
        assert s["__key__"] == f"{i:06d}" and s["txt"] == f"caption {i}" and s["cls"] == i
        assert s["npy"].dtype == np.float32 and s["npy"].shape == (i, 1)
        assert np.array_equal(s["npy"][:, 0], np.arange(i))
    assert [(s.path, s.reason) for s in result.skipped] == [
        ("input 3: 3", "ValueError: three is broken")
    ]
    assert "1 input(s) left out by fn (it returned None)" in result.notes
    shown = CliRunner().invoke(main, ["inspect", "--skipped", str(out)])
    assert (
        shown.exit_code == 0 and "input 3: 3" in shown.output and "three is broken" in shown.output
    )


def test_strict_stops_at_the_failing_input_with_its_traceback(tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    with pytest.raises(packer.PackerError, match=r"input 3: 3: ValueError: three is broken") as err:
        packer.pack(range(10), out, sample_of, workers=2, strict=True, progress=False)
    assert any("raise ValueError" in note for note in err.value.__notes__)
    assert not out.exists()


def test_one_input_many_samples_are_keyed_by_position(tmp_path: Path) -> None:
    out = tmp_path / "out.lmdb"
    packer.pack(["x", "y"], out, two_of, workers=1, progress=False)
    ds = packer.open_dataset(out)
    assert [ds[i]["__key__"] for i in range(4)] == ["000000_0", "000000_1", "000001_0", "000001_1"]
    assert [ds[i]["txt"] for i in range(4)] == ["x-a", "x-b", "y-a", "y-b"]


def test_a_torch_dataset_of_tuples_packs_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "pics.lmdb"
    data = Pictures(9)
    packer.pack(data, out, fields=("png", "cls"), workers=2, progress=False)
    ds = packer.open_dataset(out)
    assert len(ds) == 9 and ds[0]["__key__"] == "000000"
    for i in range(9):
        image, label = data[i]
        got = ds[i]
        assert got["cls"] == label
        assert np.array_equal(np.asarray(got["png"]), image)


def test_a_tuple_without_fields_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(packer.PackerError, match=r"fields=\("):
        packer.pack(Pictures(2), tmp_path / "o.lmdb", workers=1, strict=True, progress=False)


def test_a_value_its_field_cannot_take_and_a_key_twice_skip_their_input(tmp_path: Path) -> None:
    def fn(i: int) -> dict[str, Any]:
        if i == 1:
            return {"__key__": "a", "cls": "not an int"}
        return {"__key__": "same" if i >= 2 else "a", "cls": i}

    out = tmp_path / "o.lmdb"
    result = packer.pack(range(4), out, fn, workers=1, progress=False)
    reasons = {s.path: s.reason for s in result.skipped}
    assert "field 'cls'" in reasons["input 1: 1"]
    assert "key written before" in reasons["input 3: 3"]
    assert len(packer.open_dataset(out)) == 2


def test_a_lambda_runs_in_forked_workers_but_not_on_an_executor(tmp_path: Path) -> None:
    out = tmp_path / "o.lmdb"
    packer.pack(range(6), out, lambda i: {"cls": i * 2}, workers=2, progress=False)
    assert [packer.open_dataset(out)[i]["cls"] for i in range(6)] == [0, 2, 4, 6, 8, 10]
    with ProcessPoolExecutor(1) as pool, pytest.raises(packer.PackerError, match="module level"):
        packer.pack(range(6), tmp_path / "p.lmdb", lambda i: {"cls": i}, executor=pool)


def test_a_worker_that_dies_is_an_error_that_says_resume(tmp_path: Path) -> None:
    with pytest.raises(packer.PackerError, match="resume=True"):
        packer.pack(range(40), tmp_path / "o.lmdb", dies, workers=2, progress=False)
    assert not (tmp_path / "o.lmdb").exists()


def test_every_input_failing_is_an_error_not_an_empty_dataset(tmp_path: Path) -> None:
    with pytest.raises(packer.PackerError, match="no usable samples|no sample"):
        packer.pack(range(3), tmp_path / "o.lmdb", not_a_sample, workers=1, progress=False)


@pytest.mark.parametrize(
    ("inputs", "kwargs", "message"),
    [
        ("paths.txt", {}, "not a list of inputs"),
        ({"a": 1}, {}, "mapping"),
        ([], {}, "empty"),
        ([1], {"workers": 0}, "workers=0"),
        ([1], {"fn": 3}, "not callable"),
        ([1], {"resume": True, "overwrite": True}, "exclude each other"),
        ([1], {"fields": "jpg"}, "list of field names"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    tmp_path: Path, inputs: Any, kwargs: dict[str, Any], message: str
) -> None:
    kwargs = {"fn": sample_of, **kwargs}
    with pytest.raises(packer.PackerError, match=message):
        packer.pack(inputs, tmp_path / "o.lmdb", progress=False, **kwargs)
    assert not list(tmp_path.iterdir())


def test_a_url_destination_says_how(tmp_path: Path) -> None:
    with pytest.raises(packer.PackerError, match="packer upload"):
        packer.pack([1], "s3://bucket/o.lmdb", sample_of)


def test_resume_refuses_changed_inputs_and_another_fn(tmp_path: Path) -> None:
    out = tmp_path / "o.lmdb"
    with pytest.raises(packer.PackerError):
        packer.pack(range(40), out, dies, workers=2, shard_size="64B", progress=False)
    partial = tmp_path / "o.lmdb.partial"
    assert partial.is_dir()
    with pytest.raises(packer.PackerError, match="cannot resume.*files 40 → 41"):
        packer.pack(range(41), out, dies, resume=True, progress=False)
    with pytest.raises(packer.PackerError, match="cannot resume.*option fn"):
        packer.pack(range(40), out, two_of, resume=True, progress=False)
    with pytest.raises(packer.PackerError, match="interrupted pack.*resume=True"):
        packer.pack(range(40), out, dies, progress=False)
    assert partial.is_dir()  # nothing lost by a refused resume


def test_the_spec_sent_to_workers_pickles() -> None:
    from packer.write.pack_inputs import PackSpec

    spec = PackSpec(fn=sample_of, names=None, declared=None)
    assert pickle.loads(pickle.dumps(spec)) == spec
