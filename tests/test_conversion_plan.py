"""A conversion is one immutable plan: built once from the arguments, equal for equal arguments,
picklable, and what the writer and the manifest get comes from it."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import packer
from packer.core.manifest import shard_name
from packer.core.sizes import parse_size
from packer.decode.check import DEFAULT_MAX_PIXELS
from packer.demo.image import DemoTree
from packer.formats import by_name, lmdb
from packer.formats.writer import WriterBase
from packer.write.loading import DEFAULT_MAX_FILE_SIZE
from packer.write.plan import ConversionPlan, Limits, plan_conversion


def test_the_plan_is_frozen(tree: DemoTree, tmp_path: Path) -> None:
    plan = plan_conversion(tree.root, tmp_path / "out.lmdb")
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.shard_size = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.settings.limits.max_pixels = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.prepared.cpu_bound = True  # type: ignore[misc,union-attr]


def test_equal_arguments_build_equal_plans_and_write_nothing(
    tree: DemoTree, tmp_path: Path
) -> None:
    dst = tmp_path / "out.npy"
    one = plan_conversion(tree.root, dst, shard_size="1MiB", workers=2, max_side=32)
    two = plan_conversion(tree.root, dst, shard_size=1 << 20, workers=2, max_side=32)
    assert one == two
    assert one != plan_conversion(tree.root, dst, shard_size="2MiB", workers=2, max_side=32)
    assert one.format == "npy" and one.kind == "image" and one.settings.shard_size == 1 << 20
    assert one.settings.limits == Limits(parse_size(DEFAULT_MAX_FILE_SIZE), DEFAULT_MAX_PIXELS)
    assert one.settings.kind_options() == {"max_side": 32}
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # planning writes nothing


def test_the_plan_pickles_without_its_executor(tree: DemoTree, tmp_path: Path) -> None:
    with ThreadPoolExecutor(1) as pool:  # holds locks and threads: it does not pickle
        plan = plan_conversion(tree.root, tmp_path / "out.h5", executor=pool)
        again = pickle.loads(pickle.dumps(plan))
    assert again == plan
    assert plan.settings.executor is pool and again.settings.executor is None
    assert again.prepared.source == plan.prepared.source  # type: ignore[union-attr]


def test_a_root_of_splits_plans_each_split_from_the_one_plan(
    tree: DemoTree, tmp_path: Path
) -> None:
    root = tmp_path / "imagenet"
    shutil.copytree(tree.root, root / "train")
    shutil.copytree(tree.root, root / "val")
    plan = plan_conversion(root, tmp_path / "out.lmdb", shard_size="64KiB", strict=False)
    assert plan.kind == "splits" and plan.splits is not None
    assert plan.splits.splits == ["train", "val"]
    assert pickle.loads(pickle.dumps(plan)) == plan
    (tmp_path / "out.lmdb.partial").mkdir()  # where the run converts its splits
    val = plan.for_split("val", tmp_path / "out.lmdb.partial" / "val", resume=False)
    assert (val.src, val.kind, val.layout, val.splits) == (root / "val", "image", "shards", None)
    assert (val.settings, val.format) == (plan.settings, "lmdb")
    assert val.prepared is plan.splits.prepared["val"]


def test_the_writer_and_the_manifest_take_their_options_from_the_plan(
    tree: DemoTree, tmp_path: Path
) -> None:
    dst = tmp_path / "out.lmdb"
    plan = plan_conversion(tree.root, dst, shard_size="64KiB", workers=1, check="fast")
    job = plan.job()
    assert isinstance(plan, ConversionPlan)
    assert (job.fmt, job.layout, job.shard_size, job.workers) == (lmdb, "shards", 1 << 16, 1)
    assert job.partial == tmp_path / "out.lmdb.partial"
    assert job.max_file_size == plan.settings.limits.max_file_size
    result = packer.convert(tree.root, dst, shard_size="64KiB", workers=1, check="fast")
    recorded = {k: v for k, v in result.manifest.options.items() if k != "storage"}
    assert recorded == plan.options
    assert recorded["check"] == "fast" and recorded["shard_size"] == 1 << 16


@pytest.mark.parametrize("name", ["lmdb", "hdf5", "npy", "bmp"])
def test_every_writer_shares_the_base(name: str, tmp_path: Path) -> None:
    """One base holds what writers share; leaving the ``with`` drops an open shard undurably."""
    fmt = by_name(name)
    assert issubclass(fmt.Writer, WriterBase)
    layout = "per-sample" if name == "bmp" else "shards"
    with fmt.Writer(tmp_path, [100, 100], layout, "image") as writer:
        assert (writer.root, writer.planned, writer.kind) == (tmp_path, [100, 100], "image")
        writer.write(0, "class_00/a", [b"x" * 10])
        entry = writer.finish_shard()
        if layout == "shards":
            assert entry is not None and entry.name == shard_name(0, fmt.SHARD_SUFFIX)
            assert entry.bytes == (tmp_path / entry.name).stat().st_size
        writer.write(1, "class_00/b", [b"y" * 10])  # rolls to shard 1, left open
