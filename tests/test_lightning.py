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


def train(data: str, ckpt_dir: str, log: str, kill_at: int, resume: str, workers: int) -> None:
    """The child: fit 2 epochs of ``data``, logging each batch's keys with its global step;
    SIGKILL itself in the training step of global step ``kill_at`` (-1: never)."""
    import pytorch_lightning as pl
    import torch
    from torchdata.stateful_dataloader import StatefulDataLoader

    import packer

    dataset = packer.open_dataset(data, output="bytes")

    class Keys(torch.utils.data.Dataset):
        shard_of_sample = dataset.shard_of_sample

        def __len__(self) -> int:
            return len(dataset)

        def __getitem__(self, i: int) -> str:
            dataset[i]  # really read the sample
            return str(dataset.keys[i])

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)

        def training_step(self, batch: list[str], batch_idx: int) -> Any:
            with open(log, "a") as fh:
                fh.write(json.dumps([self.global_step, self.current_epoch, batch]) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            if self.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return self.layer(torch.ones(len(batch), 1)).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> Any:
            keys = Keys()
            return StatefulDataLoader(
                keys,
                batch_size=BATCH,
                sampler=packer.ShardedSampler(keys, seed=5, block=3),
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


def run_child(tmp: Path, data: Path, kill_at: int, resume: str, workers: int) -> int:
    command = [sys.executable, __file__, str(data), str(tmp / "ckpt"), str(tmp / "log.jsonl")]
    command += [str(kill_at), resume, str(workers)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if kill_at < 0:
        assert done.returncode == 0, done.stderr[-3000:]
    return done.returncode


@pytest.mark.parametrize("workers", [0, 2])
def test_a_killed_lightning_fit_resumes_the_epoch_exactly(
    packed: dict[str, Path], tmp_path: Path, workers: int
) -> None:
    pytest.importorskip("pytorch_lightning")
    import packer

    keys = [str(k) for k in packer.open_dataset(packed[".lmdb"], output="bytes").keys]
    steps = -(-len(keys) // BATCH)  # per epoch
    kill_at = steps + EVERY  # epoch 1, after its checkpoint at step 2 * EVERY
    code = run_child(tmp_path, packed[".lmdb"], kill_at, "", workers)
    assert code == -signal.SIGKILL
    last = 2 * EVERY
    ckpt = tmp_path / "ckpt" / f"step={last}.ckpt"
    assert ckpt.is_file(), sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    first = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert first[-1][0] == kill_at  # the killed step was received, never trained
    (tmp_path / "log.jsonl").unlink()
    run_child(tmp_path, packed[".lmdb"], -1, str(ckpt), workers)
    second = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert second[0][:2] == [last, 1]  # resumed at the checkpoint's step, in epoch 1
    epoch0 = [k for step, epoch, batch in first if epoch == 0 for k in batch]
    epoch1 = [k for step, epoch, batch in first if epoch == 1 and step < last for k in batch]
    epoch1 += [k for _, epoch, batch in second for k in batch]
    assert Counter(epoch0) == Counter(keys) == Counter(epoch1)  # each sample exactly once
    assert epoch0 != epoch1  # set_epoch reached the sampler: a new order


if __name__ == "__main__":
    data_arg, ckpt_arg, log_arg, kill_arg, resume_arg, workers_arg = sys.argv[1:7]
    train(data_arg, ckpt_arg, log_arg, int(kill_arg), resume_arg, int(workers_arg))
