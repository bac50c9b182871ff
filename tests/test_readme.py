"""Every Python block of README.md and of the docs (docs/*.md, in their table of contents'
order) runs, in order, as one session, against real data.

The blocks are the user's first code: a block that no longer runs (a renamed argument, a syntax
slip) fails here. Names a block leaves to the user (``my_torchvision_transform``, the batch size
``B``, ...) are the only things the test supplies; each is listed in ``USER_NAMES``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import packer
from packer.demo.fields import make_caption_set, make_coco_set, write_shards, write_table
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def pages() -> list[Path]:
    """README.md, then every docs page in the order of docs/index.md's table of contents."""
    index = (ROOT / "docs" / "index.md").read_text()
    toc = index.split("```{toctree}", 1)[1].split("```", 1)[0]
    names = [line.strip() for line in toc.splitlines() if line.strip() and ":" not in line]
    return [README, *(ROOT / "docs" / f"{name}.md" for name in names)]


def _to_tensor(image: Any) -> torch.Tensor:
    return torch.from_numpy(np.asarray(image.convert("RGB").resize((32, 32)))).permute(2, 0, 1)


USER_NAMES: dict[str, Any] = {
    "my_torchvision_transform": _to_tensor,
    "train_transform": _to_tensor,
    "train_tf": _to_tensor,
    "checkpoint": None,
    "save": lambda state: None,
    "my_gpu_decode": bytes,
    "B": 4,
    "resuming": False,
    "start_epoch": 0,
    "epochs": 1,
    "time_to_save": True,
    "epoch": 0,
}


def blocks() -> list[tuple[str, str]]:
    return [(page.name, code) for page in pages() for code in BLOCK.findall(page.read_text())]


def test_readme_and_docs_have_python_blocks() -> None:
    assert len(BLOCK.findall(README.read_text())) >= 4
    assert len(blocks()) >= 10
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert on_disk == {p.name for p in pages()[1:]} | {"index.md"}  # no page left out


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The files the README's blocks name (train.lmdb, val.lmdb, imagenet.lmdb, extra.npy,
    ucf.npy, pairs/, pairs.lmdb, shards/, table/, coco/), in the working folder."""
    images = make_image_tree(tmp_path / "src", classes=2, per_class=3, size=(64, 48), bad=0)
    for name in ("train.lmdb", "val.lmdb", "imagenet.lmdb", "extra.npy"):
        packer.convert(images.root, tmp_path / name, workers=1, progress=False)
    pairs = make_caption_set(tmp_path / "pairs", samples=6, size=(64, 48))
    write_shards(pairs, tmp_path / "shards", per_shard=3)
    write_table(pairs, tmp_path / "table" / "captions.csv")
    make_coco_set(tmp_path / "coco", images=3)
    packer.convert(tmp_path / "pairs", tmp_path / "pairs.lmdb", workers=1, progress=False)
    videos = make_video_tree(tmp_path / "videos", classes=2, per_class=2, frames=(9, 12))
    packer.convert(videos.root, tmp_path / "ucf.npy", workers=1, progress=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.filterwarnings(
    "ignore:This DataLoader will create:UserWarning"
)  # num_workers=8 on 2 CPUs
@pytest.mark.filterwarnings("ignore:'pin_memory' argument:UserWarning")  # no GPU here
@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")  # torchdata
def test_readme_python_blocks_run(workspace: Path) -> None:
    namespace: dict[str, Any] = dict(USER_NAMES)
    dist.init_process_group(
        "gloo", init_method=f"file://{workspace / 'pg'}", world_size=1, rank=0
    )  # the DDP block asks the process group for its rank
    try:
        for number, (page, code) in enumerate(blocks(), 1):
            try:
                exec(compile(code, f"{page} python block {number}", "exec"), namespace)
            except Exception as exc:
                pytest.fail(f"{page} python block {number} failed: {exc!r}\n{code}")
    finally:
        dist.destroy_process_group()
    assert os.path.exists("ckpt.pt")  # the DDP block's checkpoint was written
