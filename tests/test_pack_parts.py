"""``packer.pack(..., part=(i, n))`` and ``packer merge``: parts of consecutive inputs, written
apart (as SLURM array tasks would), joined into the samples, keys and order of one run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main


def sample_of(i: int) -> Any:
    if i % 9 == 4:
        raise ValueError(f"input {i} is broken")
    if i % 10 == 7:
        return None
    return {"txt": f"caption {i}", "cls": i, "npy": np.full((i % 3 + 1,), i, np.int32)}


def other_fn(i: int) -> Any:
    return {"txt": "x", "cls": i, "npy": np.zeros(1, np.int32)}


def everything(path: Path) -> list[tuple[str, str, int, list[int]]]:
    ds = packer.open_dataset(path)
    return [
        (s["__key__"], s["txt"], s["cls"], s["npy"].tolist())
        for s in (ds[i] for i in range(len(ds)))
    ]


def _parts(dst: Path, n: int, fn: Any = sample_of, count: int = 40, **kw: Any) -> None:
    for i in range(n):
        packer.pack(
            range(count),
            dst,
            fn,
            part=(i, n),
            shard_size="200B",
            progress=False,
            workers=1 + i % 2,
            **kw,
        )


def test_three_parts_merge_into_the_samples_of_one_run(tmp_path: Path) -> None:
    whole = tmp_path / "whole.lmdb"
    one = packer.pack(range(40), whole, sample_of, shard_size="200B", progress=False, workers=1)
    dst = tmp_path / "out.lmdb"
    _parts(dst, 3)
    assert sorted(p.name for p in tmp_path.iterdir() if "part" in p.name) == [
        "out.lmdb.part-0",
        "out.lmdb.part-1",
        "out.lmdb.part-2",
    ]
    merged = packer.merge(dst, progress=False)
    assert everything(dst) == everything(whole)
    assert [(s.path, s.reason) for s in merged.skipped] == [(s.path, s.reason) for s in one.skipped]
    assert "4 input(s) left out by fn (it returned None)" in merged.notes
    assert not list(tmp_path.glob("out.lmdb.part-*"))
    assert packer.verify(dst).ok
    shown = CliRunner().invoke(main, ["inspect", "--skipped", str(dst)])
    assert "input 4: 4" in shown.output and "input 31: 31" in shown.output


def test_a_missing_part_or_another_fn_is_refused_and_nothing_lost(tmp_path: Path) -> None:
    dst = tmp_path / "out.npy"
    packer.pack(range(40), dst, sample_of, part=(0, 3), shard_size="200B", progress=False)
    packer.pack(range(40), dst, sample_of, part=(2, 3), shard_size="200B", progress=False)
    with pytest.raises(packer.PackerError, match=r"missing or incomplete: .*out.npy.part-1"):
        packer.merge(dst, progress=False)
    packer.pack(range(40), dst, other_fn, part=(1, 3), shard_size="200B", progress=False)
    with pytest.raises(packer.PackerError, match="not of the same pack: option fn"):
        packer.merge(dst, progress=False)
    assert not dst.exists() and len(list(tmp_path.glob("out.npy.part-*"))) == 3


def test_a_part_killed_and_resumed_then_merged(tmp_path: Path) -> None:
    dst = tmp_path / "out.lmdb"
    _parts(dst, 2)
    part1 = tmp_path / "out.lmdb.part-1"
    record = json.loads((part1 / "part.json").read_text())
    shutil.move(
        part1, tmp_path / "out.lmdb.part-1.partial"
    )  # as a kill before publication leaves it
    (tmp_path / "out.lmdb.part-1.partial" / "part.json").unlink()
    with pytest.raises(packer.PackerError, match="missing or incomplete"):
        packer.merge(dst, progress=False)
    again = packer.pack(
        range(40), dst, sample_of, part=(1, 2), shard_size="200B", resume=True, progress=False
    )
    assert any("resumed at input" in n for n in again.notes)
    assert json.loads((part1 / "part.json").read_text()) == record
    packer.merge(dst, progress=False)
    whole = tmp_path / "whole.lmdb"
    packer.pack(range(40), whole, sample_of, shard_size="200B", progress=False)
    assert everything(dst) == everything(whole)


def test_parts_that_saw_different_fields_are_refused_with_the_fix(tmp_path: Path) -> None:
    def fields_by_half(i: int) -> Any:
        return {"txt": "a"} if i < 10 else {"txt": "b", "cls": i}

    dst = tmp_path / "out.lmdb"
    for i in range(2):
        packer.pack(range(20), dst, fields_by_half, part=(i, 2), progress=False, workers=1)
    with pytest.raises(packer.PackerError, match="declare the fields"):
        packer.merge(dst, progress=False)


def test_the_cli_part_and_merge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listing = tmp_path / "inputs.txt"
    listing.write_text("".join(f"line {i}\n" for i in range(7)))
    (tmp_path / "upper_mod.py").write_text("def up(s):\n    return {'txt': s.upper()}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for i in range(2):
        done = CliRunner().invoke(
            main, ["pack", "upper_mod:up", str(listing), "o.lmdb", "--part", f"{i}/2", "-q"]
        )
        assert done.exit_code == 0, done.output
    bad = CliRunner().invoke(
        main, ["pack", "upper_mod:up", str(listing), "o.lmdb", "--part", "2/2"]
    )
    assert bad.exit_code == 1 and "invalid part 2/2" in bad.output
    merged = CliRunner().invoke(main, ["merge", "o.lmdb"])
    assert merged.exit_code == 0, merged.output
    ds = packer.open_dataset(tmp_path / "o.lmdb")
    assert [ds[i]["txt"] for i in range(7)] == [f"LINE {i}" for i in range(7)]
