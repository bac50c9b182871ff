"""PyTorch Lightning's Trainer over a packed dataset through torchdata's StatefulDataLoader and
packer.ShardedSampler: a real fit killed by SIGKILL mid-epoch, resumed with ``ckpt_path``, reads
every sample of the epoch exactly once, and the next epoch whole in a new order.

Lightning saves a training DataLoader's ``state_dict()`` in its checkpoints (the fit loop's
``combined_loader`` entry) and loads it back on ``fit(ckpt_path=...)``; it calls the sampler's
``set_epoch`` itself. The training run is a child process (this file run as a script) that kills
itself with SIGKILL inside a training step, workers and all; a second child resumes from the last
checkpoint. Skipped when pytorch_lightning is not installed (the ``lightning`` extra).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

BATCH = 2
EVERY = 4  # a checkpoint every 4 optimizer steps


class Keys:
    """A packer dataset whose items are ``"tag:key"``, each sample really read."""

    def __init__(self, path: str, tag: str) -> None:
        import packer

        self.dataset, self.tag = packer.open_dataset(path, output="bytes"), tag
        self.shard_of_sample = self.dataset.shard_of_sample

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> tuple[str, int]:
        _, label = self.dataset[i]
        return f"{self.tag}:{self.dataset.keys[i]}", label


def make_target(target: str, lmdb: str, npy: str) -> Any:
    """The LMDB, or a Mixture of it and the NPY at 1:1 (each source's 6 of 12 a different subset
    every epoch)."""
    import packer

    if target == "packed":
        return Keys(lmdb, "a")
    return packer.Mixture(
        {"a": Keys(lmdb, "a"), "b": Keys(npy, "b")}, weights={"a": 1, "b": 1}, epoch_size=12,
        seed=7, block=2,
    )  # fmt: skip


def train(
    target: str, data: list[str], ckpt_dir: str, log: str, kill_at: int, resume: str, workers: int
) -> None:
    """The child: fit 2 epochs of ``target``, logging each batch's keys with its global step;
    SIGKILL itself in the training step of global step ``kill_at`` (-1: never)."""
    import pytorch_lightning as pl
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    import packer

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: list[tuple[str, int]], batch_idx: int) -> Any:
            keys = [key for key, _ in batch]
            with open(log, "a") as fh:
                fh.write(json.dumps([self.global_step, self.current_epoch, keys]) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            if self.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.layer(torch.ones(len(batch), 1)).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> Any:
            dataset = make_target(target, *data)
            return StatefulDataLoader(
                dataset,
                batch_size=BATCH,
                # the sampler passes Lightning's set_epoch and the resume on to a Mixture
                sampler=packer.ShardedSampler(dataset, seed=5, block=3),
                num_workers=workers,
                collate_fn=list,
            )

    every = pl.callbacks.ModelCheckpoint(
        dirpath=ckpt_dir, every_n_train_steps=EVERY, save_top_k=-1, filename="{step}"
    )
    trainer = pl.Trainer(
        max_epochs=2,
        callbacks=[every],
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(), ckpt_path=resume or None)


def run_child(
    tmp: Path, target: str, data: list[str], kill_at: int, resume: str, workers: int
) -> int:
    command = [sys.executable, __file__, target, *data, str(tmp / "ckpt"), str(tmp / "log.jsonl")]
    command += [str(kill_at), resume, str(workers)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if kill_at < 0:
        assert done.returncode == 0, done.stderr[-3000:]
    return done.returncode


def epoch_keys(target: str, data: list[str], epoch: int) -> list[str]:
    """What one epoch of ``target`` holds."""
    dataset = make_target(target, *data)
    if target == "packed":
        return [dataset[i][0] for i in range(len(dataset))]
    dataset.set_epoch(epoch)
    return [dataset[i][0] for i in range(len(dataset))]


@pytest.mark.parametrize(("target", "workers"), [("mixture", 2)])  # a packed one: same path
def test_a_killed_lightning_fit_resumes_the_epoch_exactly(
    packed: dict[str, Path], tmp_path: Path, target: str, workers: int
) -> None:
    import pytorch_lightning  # noqa: F401  # never a skip: `make install` installs it

    data = [str(packed[".lmdb"]), str(packed[".npy"])]
    want = [Counter(epoch_keys(target, data, e)) for e in (0, 1)]
    steps = -(-sum(want[0].values()) // BATCH)  # per epoch
    kill_at = steps + EVERY  # epoch 1, after its checkpoint at step 2 * EVERY
    code = run_child(tmp_path, target, data, kill_at, "", workers)
    assert code == -signal.SIGKILL
    last = 2 * EVERY
    ckpt = tmp_path / "ckpt" / f"step={last}.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    first = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert first[-1][0] == kill_at  # the killed step was received, never trained
    (tmp_path / "log.jsonl").unlink()
    run_child(tmp_path, target, data, -1, str(ckpt), workers)
    second = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert second[0][:2] == [last, 1]  # resumed at the checkpoint's step, in epoch 1
    epoch0 = [k for step, epoch, batch in first if epoch == 0 for k in batch]
    epoch1 = [k for step, epoch, batch in first if epoch == 1 and step < last for k in batch]
    epoch1 += [k for _, epoch, batch in second for k in batch]
    assert Counter(epoch0) == want[0] and Counter(epoch1) == want[1]  # each exactly once
    assert epoch0 != epoch1  # set_epoch reached the sampler (and the mixture): a new order
    if target == "mixture":
        assert want[0] != want[1]  # a mixture's epochs draw different subsets


if __name__ == "__main__":
    target_arg, lmdb_arg, npy_arg, ckpt_arg, log_arg, kill_arg, resume_arg, workers_arg = sys.argv[
        1:9
    ]
    train(
        target_arg, [lmdb_arg, npy_arg], ckpt_arg, log_arg, int(kill_arg), resume_arg,
        int(workers_arg),
    )  # fmt: skip
