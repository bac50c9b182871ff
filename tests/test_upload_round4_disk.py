"""Issue 40 item 10: a full staging disk during an upload that streams its shards asks for what
streaming needs (``--staging-limit`` plus two shards, their checkpoints and the tables), not the whole output; and
that much room is enough: given it, ``--resume`` finishes. On a small real tmpfs, against a real
S3 server (moto on the loopback)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server

import packer
from packer.core.sizes import parse_size
from packer.demo.image import make_image_tree
from packer.errors import DestinationError
from packer.upload.staging import convert_to_url
from packer.write.disk_full import estimate_output
from packer.write.plan import plan_conversion

BUCKET = "round4-disk"
SHARD = "256kB"


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MB tmpfs, unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"SKIPPED LOUDLY: cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _leave(disk: Path, free: int) -> None:
    """Fill ``disk`` (its ballast rewritten) until only ``free`` bytes are free."""
    ballast = disk / "ballast"
    ballast.unlink(missing_ok=True)
    ballast.write_bytes(b"\0" * max(shutil.disk_usage(disk).free - free, 0))


def test_a_full_staging_disk_asks_for_what_streaming_needs_and_that_is_enough(
    server: S3Server, disk: Path, tmp_path: Path
) -> None:
    src = make_image_tree(tmp_path / "images", classes=2, per_class=360, size=(160, 120), bad=0)
    plan = plan_conversion(src.root, tmp_path / "whole.npy", progress=False)
    whole = estimate_output(plan.format, plan.prepared.source, plan.options, 4096)
    assert whole is not None and whole > shutil.disk_usage(disk).total, "more than the disk holds"
    url, staging = f"s3://{BUCKET}/streamed.npy", disk / "staging"
    common = dict(storage_options={"endpoint_url": server.endpoint}, staging=staging)
    common.update(shard_size=SHARD, staging_limit=1, workers=1, progress=False)
    staging.mkdir()
    _leave(disk, 100_000)  # less than one shard: full while the first is written
    with pytest.raises(DestinationError, match="disk full") as full:
        convert_to_url(src.root, url, **common)
    asked = re.search(r"about (\d+(?:\.\d+)? [kMG]?B) more is needed", str(full.value))
    assert asked, str(full.value)
    need = parse_size(asked[1])
    assert need < whole / 4, (need, whole, str(full.value))  # not the whole output
    _leave(disk, int(need * 1.2))
    result = convert_to_url(src.root, url, resume=True, **common)
    assert result.dst == url
    assert len(packer.open_dataset(url, storage_options=common["storage_options"])) == 720
