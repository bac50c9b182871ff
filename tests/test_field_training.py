"""Samples with fields in the training path (issue 30): a Mixture of field datasets with the
same fields (and a clear refusal otherwise), a StatefulDataLoader checkpoint that resumes
exactly, --part conversions of tars and tables merged into the same bytes as one run, and a
--resume that finishes a conversion of tars."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import packer
from packer.core.manifest import MANIFEST_NAME
from packer.demo.fields import make_caption_set, write_shards, write_table

Samples = dict[str, dict[str, bytes]]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Samples]:
    root = tmp_path_factory.mktemp("training")
    written = make_caption_set(root / "files", samples=30)
    write_shards(written, root / "tars", per_shard=7)
    write_table(written, root / "table" / "t.jsonl")
    return root, written


def _same_files(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        if name != "packer.json":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_mixture_of_field_datasets(made: tuple[Path, Samples], tmp_path: Path) -> None:
    root, written = made
    a = packer.convert(root / "files", tmp_path / "a.lmdb", progress=False).dst
    b = packer.convert(root / "tars", tmp_path / "b.npy", progress=False).dst
    mixture = packer.Mixture(
        {
            "a": packer.FieldDataset(a, fields=("txt",)),
            "b": packer.FieldDataset(b, fields=("txt",)),
        },
        weights={"a": 1, "b": 1},
        epoch_size=40,
        seed=3,
    )
    captions = {f["txt"].decode() for f in written.values()}
    got = [mixture[i][0] for i in range(len(mixture))]
    assert len(got) == 40 and set(got) <= captions
    with pytest.raises(packer.PackerError, match="same fields in every source"):
        packer.Mixture({"a": packer.FieldDataset(a, fields=("txt",)), "b": packer.FieldDataset(b)})
    with pytest.raises(packer.PackerError, match="'c' reads no fields"):
        packer.Mixture({"a": packer.FieldDataset(a), "c": list(range(3))})


def test_stateful_loader_resumes_exactly(made: tuple[Path, Samples], tmp_path: Path) -> None:
    root = made[0]
    dst = packer.convert(root / "tars", tmp_path / "c.lmdb", progress=False).dst

    def loader() -> StatefulDataLoader:
        ds = packer.FieldDataset(dst, fields=("txt", "cls"))
        sampler = packer.ShardedSampler(ds, seed=5)
        return StatefulDataLoader(
            ds, batch_size=4, sampler=sampler, num_workers=2, collate_fn=packer.collate_fields,
            multiprocessing_context="fork",
        )  # fmt: skip

    whole = [(tuple(t), c.tolist()) for t, c in loader()]
    first = loader()
    seen = []
    for n, (texts, classes) in enumerate(first):
        seen.append((tuple(texts), classes.tolist()))
        if n == 2:
            state = first.state_dict()
            break
    again = loader()
    again.load_state_dict(state)
    seen += [(tuple(t), c.tolist()) for t, c in again]
    assert seen == whole and len(whole) == 8


@pytest.mark.parametrize("source", ["tars", "table/t.jsonl"])
def test_parts_merge_into_the_bytes_of_one_run(
    source: str, made: tuple[Path, Samples], tmp_path: Path
) -> None:
    src = made[0] / source
    one = packer.convert(src, tmp_path / "one.npy", shard_size="30kB", progress=False).dst
    parts = tmp_path / "parts.npy"
    for k in range(2):
        packer.convert(src, parts, shard_size="30kB", part=(k, 2), progress=False)
    merged = packer.merge(parts, progress=False).dst
    _same_files(Path(one), Path(merged))
    assert len(packer.FieldDataset(merged)) == 30


KILLER = """
import os, signal, sys
import packer
src, dst = sys.argv[1:3]
def on_event(name, n):
    if name == "shard" and n == 1:
        os.kill(os.getpid(), signal.SIGKILL)
packer.convert(src, dst, shard_size="30kB", workers=2, progress=False, on_event=on_event)
"""


def test_tars_killed_then_resumed_give_the_same_bytes(
    made: tuple[Path, Samples], tmp_path: Path
) -> None:
    src = str(made[0] / "tars" / "{000000..000004}.tar")
    one = packer.convert(src, tmp_path / "one.lmdb", shard_size="30kB", progress=False).dst
    dst = tmp_path / "out.lmdb"
    killed = subprocess.run([sys.executable, "-c", KILLER, src, str(dst)], capture_output=True)
    assert killed.returncode == -9 and not (dst / MANIFEST_NAME).exists()
    assert (tmp_path / "out.lmdb.partial").is_dir()
    cmd = [sys.executable, "-m", "packer", "convert", src, str(dst), "--resume"]
    resumed = subprocess.run([*cmd, "--shard-size", "30kB"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "nothing to resume" not in resumed.stdout + resumed.stderr  # the kept shard was kept
    _same_files(Path(one), dst)
