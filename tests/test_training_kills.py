"""Training runs killed for real with SIGKILL and resumed on another number of ranks and workers:
what the loop received is exactly one epoch, in exactly the order of an uninterrupted run.

Each case launches tests/killrun_train.py (gloo DDP on 127.0.0.1, ShardedSampler, torchdata's
StatefulDataLoader with forked workers, a linear model, a checkpoint every 2 steps written
atomically by rank 0) four times on the same checkpoint file, each rank a process of its own
forked by the test process's forkserver (torch imported there once, not by every rank):

1. 2 ranks × 2 workers, killed after a step chosen by a seeded RNG;
2. 1 rank × 2 workers, killed while the checkpoint of a chosen step is half written;
3. 2 ranks × 1 worker, killed after a chosen step;
4. 1 rank × 1 worker, run to the end of the epoch.

The kill takes every process of the run (ranks and their DataLoader workers, each rank in its own
session) with SIGKILL, once rank 0 holds at the chosen point (it touches ``held`` and sleeps), so
the points are exact and the test cannot race the run.

**What counts as received.** Every rank logs ``step slot key`` for each sample before the step's
forward pass (steps are numbered globally across the runs: a resumed run continues the saved
step). A run resumed from the checkpoint of step ``C0`` and killed when the last complete
checkpoint on disk is that of step ``C1`` contributes its log lines with ``C0 <= step < C1``; the
lines from ``C1`` on were received after the checkpoint the next run resumes from, so that run
reads those samples again and they are dropped. The last run contributes every line from its
``C0``. Within a run, rank ``r``'s slot ``t`` of step ``s`` is global position
``(s - C0) * B * R + t * R + r`` after the resume point (ShardedSampler deals the global order
round robin), so sorting by ``(step, slot, rank)`` gives the order the run consumed.

The concatenation over the four runs must equal the keys of ``ShardedSampler(dataset).order()``
with one rank: every sample once for a packed dataset, and for a ``packer.Mixture`` exactly the
uninterrupted order (its small source repeats by the mixture's rule, so a multiset check alone
would be weaker).

**Worker counts.** torchdata restores a loader state only into a loader with the same number of
workers (``assert self._num_workers == ...`` in ``_restore_main_state``). The script therefore
restores the loader's own state when the worker count is the saved one (into runs 2 and 4) and
otherwise the sampler's state at the global position the checkpoint recorded (into run 3, 2 → 1
worker): both paths are exercised, each across a change of the rank count.

A third case runs two epochs with ``persistent_workers=True`` and resumes from a checkpoint taken
after the epoch boundary.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import time
from collections import Counter
from pathlib import Path

import killrun_train as train
import numpy as np
import pytest
import torch

import packer
from packer.demo.image import make_image_tree

pytestmark = pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata

ROOT = Path(__file__).resolve().parents[1]
BATCH, EVERY, N = 2, 2, 36  # batch per rank, checkpoint period in steps, samples per epoch
TIMEOUT = 40.0  # seconds for one launch to reach its hold point or its end


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """A 36-image LMDB (3 classes × 12, small shards) and an 8-image NPY for the mixture."""
    root = tmp_path_factory.mktemp("kills")
    main = make_image_tree(root / "main", classes=3, per_class=12, size=(64, 48), bad=0)
    extra = make_image_tree(root / "extra", classes=2, per_class=4, size=(64, 48), bad=0, seed=5)
    packer.convert(main.root, root / "main.lmdb", shard_size="20kB", workers=1, progress=False)
    packer.convert(extra.root, root / "extra.npy", shard_size="20kB", workers=1, progress=False)
    assert len(packer.open_dataset(root / "main.lmdb").manifest.shards) > 2
    return {
        "dataset": [str(root / "main.lmdb")],
        "mixture": [str(root / "main.lmdb"), str(root / "extra.npy")],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def outputs(run: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(run.glob("out*")))


class Rank:
    """A rank of a run: :func:`killrun_train.forked_rank` in a child of this test process's
    forkserver (its own session, stdout and stderr into its ``out`` file)."""

    def __init__(self, args: list[str], env: dict[str, str], out: Path) -> None:
        context = multiprocessing.get_context("forkserver")
        self.process = context.Process(target=train.forked_rank, args=(args, env, str(out)))
        self.process.start()
        assert self.process.pid is not None
        self.pid: int = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float) -> None:
        self.process.join(timeout)
        assert self.process.exitcode is not None, f"rank {self.pid} still running"


def kill(procs: list[Rank]) -> None:
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the rank and its DataLoader workers
        except ProcessLookupError:
            pass
    for proc in procs:
        proc.wait(timeout=10)


def launch(run: Path, data: list[str], ranks: int, workers: int, tag: str, *extra: str) -> None:
    """Run the script on ``ranks`` ranks (each in its own session) to its end; with a hold
    point, SIGKILL every process of the run once rank 0 holds. Bounded by ``TIMEOUT``: a run
    that ends early, fails or hangs is killed and the test fails with its output."""
    (run / "held").unlink(missing_ok=True)
    env = {**os.environ, "WORLD_SIZE": str(ranks), "MASTER_PORT": str(free_port())}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    args = ["--data", *data, "--dir", str(run)]
    args += ["--workers", str(workers), "--every", str(EVERY), "--log", tag, *extra]
    procs = []
    for rank in range(ranks):
        procs.append(Rank(args, {**env, "RANK": str(rank)}, run / f"out.{tag}.{rank}"))
    holding = bool({"--hold", "--hold-in-save"} & set(extra))
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            if holding and (run / "held").exists():
                return
            codes = [proc.poll() for proc in procs]
            if any(code not in (None, 0) for code in codes) or (holding and None not in codes):
                pytest.fail(f"launch {tag} ended with {codes} before its hold:\n{outputs(run)}")
            if not holding and None not in codes:
                return
            time.sleep(0.05)
        pytest.fail(f"launch {tag} took over {TIMEOUT} s:\n{outputs(run)}")
    finally:
        kill(procs)


def received(run: Path, tag: str, start: int, end: int | None) -> list[str]:
    """The keys launch ``tag`` received from step ``start`` up to (not including) ``end``."""
    lines = []
    for path in sorted((run / tag).glob("rank*.txt")):
        rank = int(path.stem[4:])
        for line in path.read_text().splitlines():
            step, slot, key = line.split(" ", 2)
            if int(step) >= start and (end is None or int(step) < end):
                lines.append((int(step), int(slot), rank, key))
    assert len({line[:3] for line in lines}) == len(lines), f"{tag}: a slot logged twice"
    return [key for *_, key in sorted(lines)]


def saved_step(run: Path) -> int:
    return int(torch.load(run / "ckpt.pt", weights_only=False)["step"])


def steps_left(position: int, ranks: int) -> int:
    return -(-(N - position) // (BATCH * ranks))


@pytest.mark.parametrize("kind", ["dataset", "mixture"])
def test_killed_runs_resume_exactly_on_other_rank_and_worker_counts(
    data: dict[str, list[str]], kind: str, tmp_path: Path
) -> None:
    expected = train.open_data(data[kind])
    assert len(expected) == N
    order = packer.ShardedSampler(expected, num_replicas=1, rank=0, seed=3).order()
    want = [expected.key(int(i)) for i in order]
    rng = np.random.default_rng(22 if kind == "dataset" else 23)
    got: list[str] = []
    step = position = 0  # the checkpoint resumed from: its step and global position
    plan = [(2, 2, "hold"), (1, 2, "hold-in-save"), (2, 1, "hold"), (1, 1, None)]
    for n, (ranks, workers, how) in enumerate(plan):
        left, tag = steps_left(position, ranks), f"run{n}"
        if how == "hold":
            # after one more checkpoint, before the end, and early enough to leave room
            at = int(rng.integers(step + EVERY, min(step + left, step + EVERY + 3)))
            launch(tmp_path, data[kind], ranks, workers, tag, "--hold", str(at))
            expect = at // EVERY * EVERY
        elif how == "hold-in-save":
            # the second or third checkpoint of the run (the first one completes)
            last = min((step + left - 1) // EVERY, step // EVERY + 3)
            at = int(rng.integers(step // EVERY + 2, last + 1)) * EVERY
            launch(tmp_path, data[kind], ranks, workers, tag, "--hold-in-save", str(at))
            assert (tmp_path / "ckpt.tmp").exists(), "the kill did not land in the write"
            expect = at - EVERY
        else:
            launch(tmp_path, data[kind], ranks, workers, tag)
            got += received(tmp_path, tag, step, None)
            break
        assert saved_step(tmp_path) == expect, f"{tag}: the last complete checkpoint"
        got += received(tmp_path, tag, step, expect)
        position += (expect - step) * BATCH * ranks
        step = expect
    assert got == want, f"{kind}: received {len(got)} keys, {len(want)} in one epoch"
    if kind == "dataset":
        assert Counter(got) == Counter(str(k) for k in expected.dataset.keys)


def test_persistent_workers_resume_a_checkpoint_taken_after_an_epoch_boundary(
    data: dict[str, list[str]], tmp_path: Path
) -> None:
    """Two epochs with ``persistent_workers=True``: 2 ranks × 2 workers killed in epoch 1 (the
    workers crossed the boundary alive), resumed on 1 rank × 2 workers from a checkpoint taken in
    epoch 1: epoch 0 then epoch 1, each exactly once and in its own order."""
    expected = train.open_data(data["dataset"])
    sampler = packer.ShardedSampler(expected, num_replicas=1, rank=0, seed=3)
    want = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        want += [expected.key(int(i)) for i in sampler.order()]
    epoch_steps = steps_left(0, 2)  # steps of epoch 0 on two ranks
    at = int(np.random.default_rng(24).integers(epoch_steps + EVERY, 2 * epoch_steps - 1))
    common = ("--epochs", "2", "--persistent")
    launch(tmp_path, data["dataset"], 2, 2, "run0", *common, "--hold", str(at))
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    assert (saved["step"], saved["epoch"]) == (at // EVERY * EVERY, 1)
    got = received(tmp_path, "run0", 0, saved["step"])
    launch(tmp_path, data["dataset"], 1, 2, "run1", *common)
    got += received(tmp_path, "run1", saved["step"], None)
    assert got == want, f"received {len(got)} keys, {len(want)} in two epochs"
