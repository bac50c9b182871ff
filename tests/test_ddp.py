"""Real DDP reading: torch.distributed (gloo, CPU) in processes started by torch.multiprocessing
(forkserver), each rank with a DataLoader of 2 workers over a packed LMDB dataset."""

from __future__ import annotations

import json
import socket
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import packer
from packer.demo.image import make_image_tree

BATCH = 3


class Indexed(Dataset):
    """Reads the packed sample and says which one it was: (index, key, label, bytes read)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[int, str, int, int]:
        data, label = self.dataset[i]
        return i, self.dataset.keys[i], label, len(data)


def as_list(batch: list) -> list:
    return batch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def read(dataset: Indexed, sampler: Any, steps: int | None = None) -> list[int]:
    """The indices this rank's DataLoader (2 forked workers) serves, ``steps`` batches or all."""
    loader = DataLoader(
        dataset,
        batch_size=BATCH,
        sampler=sampler,
        num_workers=2,
        multiprocessing_context="fork",
        collate_fn=as_list,
    )
    seen = []
    for step, batch in enumerate(loader):
        if step == steps:
            break
        for i, key, label, size in batch:
            assert key == dataset.dataset.keys[i] and size > 0
            assert label == dataset.dataset.targets[i]
            seen.append(i)
    return seen


def make_sampler(kind: str, dataset: Indexed) -> Any:
    if kind == "distributed":
        return DistributedSampler(dataset, seed=1)  # world and rank from the process group
    return packer.ShardedSampler(dataset.dataset, seed=1)


def job(rank: int, world: int, port: int, root: str, out: str, task: dict[str, Any]) -> None:
    """One rank: every epoch of each sampler, or a stop after ``steps``, or a resume."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        dataset = Indexed(packer.LMDBDataset(root, output="bytes"))
        result: dict[str, Any] = {}
        if task["kind"] == "epochs":
            for kind in ("distributed", "sharded"):
                sampler = make_sampler(kind, dataset)
                for epoch in (0, 1):
                    sampler.set_epoch(epoch)
                    result[f"{kind}/{epoch}"] = read(dataset, sampler)
        elif task["kind"] == "stop":
            sampler = make_sampler("sharded", dataset)
            sampler.set_epoch(3)
            result["seen"] = read(dataset, sampler, task["steps"])
            result["state"] = sampler.state_dict(consumed=task["steps"] * BATCH)
            result["handed_out"] = sampler.state_dict()["consumed"]  # workers prefetched more
        else:
            sampler = make_sampler("sharded", dataset)
            sampler.load_state_dict(task["state"])
            sampler.set_epoch(3)
            result["seen"] = read(dataset, sampler)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    Path(out, f"{rank}.json").write_text(json.dumps(result))


def run(world: int, root: Path, out: Path, task: dict[str, Any]) -> list[dict[str, Any]]:
    out.mkdir()
    # forkserver: each rank a fresh process (nothing of the test's state inherited, as under
    # spawn), forked from this test process's forkserver, which imported torch once
    args = (world, free_port(), str(root), str(out), task)
    mp.start_processes(job, args=args, nprocs=world, start_method="forkserver")
    return [json.loads((out / f"{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def lmdb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """29 small images in several LMDB shards (29 is odd: two ranks need a padding sample)."""
    root = tmp_path_factory.mktemp("ddp")
    tree = make_image_tree(root / "images", classes=3, per_class=10, size=(64, 48), bad=0)
    next(iter(sorted(tree.good))).unlink()
    dst = root / "images.lmdb"
    packer.convert(tree.root, dst, shard_size="20kB", workers=1, progress=False)
    return dst


def test_ranks_split_every_epoch(lmdb: Path, tmp_path: Path) -> None:
    n = len(packer.LMDBDataset(lmdb))
    assert n == 29 and len(packer.LMDBDataset(lmdb).manifest.shards) > 2
    ranks = run(2, lmdb, tmp_path / "epochs", {"kind": "epochs"})
    for name in ("distributed/0", "distributed/1", "sharded/0", "sharded/1"):
        a, b = (r[name] for r in ranks)
        assert len(a) == len(b) == 15, name  # equal counts: one sample repeated as padding
        assert set(a) | set(b) == set(range(n)), name
        assert len(set(a) & set(b)) == 1 and len(set(a)) == len(set(b)) == 15, name
    for kind in ("distributed", "sharded"):
        assert ranks[0][f"{kind}/0"] != ranks[0][f"{kind}/1"]  # set_epoch reshuffles


def test_stop_and_resume_on_two_and_on_one_rank(lmdb: Path, tmp_path: Path) -> None:
    """Stop after 2 batches of 3 per rank, save, restart on 2 ranks and instead on 1: what the
    ranks read before and after is exactly the epoch (the 2-rank restart pads one sample)."""
    n = 29
    stopped = run(2, lmdb, tmp_path / "stop", {"kind": "stop", "steps": 2})
    state = stopped[0]["state"]
    assert stopped[1]["state"] == state and state["consumed"] == 2 * 2 * BATCH
    assert stopped[0]["handed_out"] > state["consumed"]  # why the loop must say what it consumed
    before = stopped[0]["seen"] + stopped[1]["seen"]
    assert len(before) == len(set(before)) == 12
    for world in (2, 1):
        resumed = run(world, lmdb, tmp_path / f"resume{world}", {"kind": "resume", "state": state})
        after = [i for r in resumed for i in r["seen"]]
        assert len({len(r["seen"]) for r in resumed}) == 1
        seen = Counter(before + after)
        assert set(seen) == set(range(n)), world
        assert sum(seen.values()) == n + (n - 12) % world  # only the restart's padding repeats
        assert not set(before) & set(after), world  # padding repeats a sample of the rest
