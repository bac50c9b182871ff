"""A tiny DDP training run for tests/test_training_kills.py (one process per rank: a script, or
:func:`forked_rank` in a child of the test process's forkserver).

Rank and world size come from RANK / WORLD_SIZE, the gloo rendezvous from MASTER_PORT on
127.0.0.1. It trains a linear layer on a 4-number summary of each decoded image, reading a packed
dataset (or a packer.Mixture of two) through ShardedSampler and torchdata's StatefulDataLoader.

Per rank it appends ``step slot key`` to ``LOG/rank{R}.txt`` (``--log``) (flush + fsync) for every sample it
receives, *before* the step's forward/backward: a step's all-reduce cannot complete before every
rank logged it, so when rank 0 writes a checkpoint after step ``g`` (``step = g + 1``), every rank
has logged every step below it. Every ``--every`` steps rank 0 writes the checkpoint (loader state,
model, optimizer, step) to a temp file, fsyncs it and ``os.replace``s it over ``ckpt.pt``.

``--hold STEP`` stops rank 0 after step STEP (its checkpoint, if any, written) and
``--hold-in-save STEP`` stops it halfway through writing the checkpoint of step STEP; both touch
``held`` and sleep until the test kills the run with SIGKILL.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from PIL import Image
from torch.nn.parallel import DistributedDataParallel
from torchdata.stateful_dataloader import StatefulDataLoader

import packer


class Summarised:
    """Items ``(key, 4 features, label)``: a packed dataset's or a mixture's decoded image reduced
    to its channel means and overall spread; ``shard_of_sample`` passed on for the sampler."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.shard_of_sample = dataset.shard_of_sample

    def __len__(self) -> int:
        return len(self.dataset)

    def key(self, i: int) -> str:
        if isinstance(self.dataset, packer.Mixture):
            name, j = self.dataset.locate(i)
            return f"{name}:{self.dataset.sources[name].keys[j]}"
        return str(self.dataset.keys[i])

    def __getitem__(self, i: int) -> tuple[str, torch.Tensor, int]:
        data, label = self.dataset[i]
        pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"), np.float32) / 255
        features = np.append(pixels.mean(axis=(0, 1)), pixels.std())
        return self.key(i), torch.from_numpy(features.astype(np.float32)), int(label)


def open_data(paths: list[str]) -> Summarised:
    """One packed dataset, or a Mixture of two (3:1 over an epoch of 36: 27 and 9 draws, so the 8-image source repeats one)."""
    datasets = [packer.open_dataset(p, output="bytes") for p in paths]
    if len(datasets) == 1:
        return Summarised(datasets[0])
    mixture = packer.Mixture(
        {"a": datasets[0], "b": datasets[1]}, weights={"a": 3, "b": 1}, epoch_size=36, seed=7
    )
    return Summarised(mixture)


def collate(batch: list) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    keys, features, labels = zip(*batch)
    return list(keys), torch.stack(features), torch.tensor(labels)


def save(path: Path, state: dict[str, Any], hold: bool) -> None:
    """Atomic: temp file, fsync, os.replace; ``hold`` stops halfway through the temp file."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    data = buffer.getvalue()
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data[: len(data) // 2] if hold else data)
        f.flush()
        os.fsync(f.fileno())
        if hold:
            wait_for_kill(path.parent)
    os.replace(tmp, path)


def wait_for_kill(run_dir: Path) -> None:
    (run_dir / "held").touch()
    time.sleep(120)  # the test kills the run long before this ends
    sys.exit("killrun_train: not killed while held")


def resume(loader: Any, sampler: Any, state: dict[str, Any], workers: int) -> None:
    """The loader's own state when the worker count is the saved one; otherwise (torchdata
    restores a loader state only into a loader with as many workers) the sampler's, at the
    global position the checkpoint recorded."""
    if state["workers"] == workers:
        loader.load_state_dict(state["loader"])
        print(f"resumed the loader at step {state['step']}", flush=True)
    else:
        saved = {"epoch": state["epoch"], "consumed": state["position"]}
        sampler.load_state_dict({**sampler.state_dict(), **saved})
        print(f"resumed the sampler at position {state['position']}", flush=True)


class Run:
    """What one epoch of the loop needs: arguments, rank, loader, model, optimizer, log."""

    def __init__(self, args: Any, rank: int, world: int, *parts: Any) -> None:
        self.args, self.rank, self.world = args, rank, world
        self.loader, self.model, self.optimizer, self.log = parts

    def epoch(self, epoch: int, step: int, position: int) -> int:
        """Train to the end of the loader's epoch from global step ``step``; ``position``: the
        samples of this epoch consumed before (a resume point). Returns the step reached."""
        args, start, per_step = self.args, step, self.loader.batch_size * self.world
        for keys, features, labels in self.loader:
            self.log.write("".join(f"{step} {slot} {key}\n" for slot, key in enumerate(keys)))
            self.log.flush()
            os.fsync(self.log.fileno())
            self.optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(features), labels)
            loss.backward()
            self.optimizer.step()
            step += 1
            if self.rank == 0 and step % args.every == 0:
                print(f"saving {step}", flush=True)
                state = {
                    "loader": self.loader.state_dict(),
                    "model": self.model.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "step": step,
                    "epoch": epoch,
                    "position": position + (step - start) * per_step,
                    "workers": args.workers,
                }
                save(Path(args.dir) / "ckpt.pt", state, hold=step == args.hold_in_save)
            if self.rank == 0 and step == args.hold:
                wait_for_kill(Path(args.dir))
        return step


def forked_rank(argv: list[str], env: dict[str, str], out: str) -> None:
    """One rank as a child of the test process's forkserver (torch already imported there: a
    fork instead of a ~2 CPU-s interpreter start and torch import per rank): a session of its
    own (the test kills its process group, the rank and its DataLoader workers, with SIGKILL),
    the test's environment, stdout and stderr into ``out``; then :func:`main` on ``argv``."""
    os.setsid()
    with open(out, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [__file__, *argv]
    main()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", nargs="+", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--every", type=int, default=2)
    p.add_argument("--hold", type=int, default=-1)
    p.add_argument("--hold-in-save", type=int, default=-1)
    p.add_argument("--log", default="log")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--persistent", action="store_true")
    args = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    torch.manual_seed(0)
    run_dir = Path(args.dir)
    dataset = open_data(args.data)
    sampler = packer.ShardedSampler(dataset, seed=3)
    loader = StatefulDataLoader(
        dataset,
        batch_size=2,
        sampler=sampler,
        num_workers=args.workers,
        multiprocessing_context="fork",
        collate_fn=collate,
        persistent_workers=args.persistent,
    )
    model = DistributedDataParallel(torch.nn.Linear(4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt, step, first, position = run_dir / "ckpt.pt", 0, 0, 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=False)
        resume(loader, sampler, state, args.workers)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step, first, position = state["step"], state["epoch"], state["position"]
    (run_dir / args.log).mkdir(exist_ok=True)
    with open(run_dir / args.log / f"rank{rank}.txt", "a") as log:
        for epoch in range(first, args.epochs):
            sampler.set_epoch(epoch)
            if isinstance(dataset.dataset, packer.Mixture):
                dataset.dataset.set_epoch(epoch)
            run = Run(args, rank, world, loader, model, optimizer, log)
            step = run.epoch(epoch, step, position)
            position = 0  # the next epoch starts at its beginning
    dist.barrier()
    dist.destroy_process_group()
    print(f"done {step}", flush=True)


if __name__ == "__main__":
    main()
