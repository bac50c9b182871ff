"""A full disk under ``packer.Writer``: one ``DestinationError`` saying how much room is needed
(never a bare ``OSError``), the shards written kept. A URL's writer streams its shards, so a full
staging disk is asked what streaming holds, with the estimate ``convert`` to a URL gives (not
the whole output), and that much room is enough. On a small real tmpfs; the URL against a real
S3 server (moto on the loopback)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import packer
from packer.core.sizes import parse_size
from packer.errors import DestinationError

BUCKET = "writer-disk"
SHARD = 256_000
SAMPLES = 480  # of ~20 kB each: ~9.6 MB, more than the 8 MB disk holds


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


def sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    return {"__key__": f"{i:04d}", "npy": rng.standard_normal(2_500), "txt": f"sample {i}"}


def write_all(dst: Any, **options: Any) -> None:
    with packer.Writer(dst, shard_size=SHARD, **options) as writer:
        for i in range(SAMPLES):
            writer.write(sample(i))


def test_a_full_local_disk_is_one_error_saying_what_is_needed(disk: Path) -> None:
    dst = disk / "out.npy"
    with pytest.raises(DestinationError) as full:
        write_all(dst)
    message = str(full.value)
    assert message.startswith(f"disk full while writing {str(dst) + '.partial'!r}: about ")
    assert "a Writer does not resume" in message and "overwrite=True" in message
    assert "--resume" not in message  # a Writer cannot follow that advice
    assert isinstance(full.value.__cause__, OSError)
    assert not dst.exists()
    assert list((disk / "out.npy.partial").glob("shard-*"))  # the shards written are kept


def test_a_full_staging_disk_asks_for_what_streaming_needs_and_that_is_enough(
    server: Any, disk: Path
) -> None:
    url, staging = f"s3://{BUCKET}/streamed.npy", disk / "staging"
    options = {"storage_options": server.options, "staging": staging}
    staging.mkdir()
    _leave(disk, 100_000)  # less than one shard: full while the first is written
    with pytest.raises(DestinationError, match="disk full") as full:
        write_all(url, **options)
    message = str(full.value)
    assert "an estimate for an upload that streams its shards" in message, message
    assert f"local staging folder of the upload to {url!r}" in message
    assert "staging=DIR" in message and "--resume" not in message
    asked = re.search(r"about (\d+(?:\.\d+)? [kMG]?B) more is needed", message)
    assert asked, message
    need = parse_size(asked[1])
    whole = SAMPLES * 20_000
    assert need < whole / 3, (need, whole, message)  # not the whole output
    assert need > 4 * SHARD  # at least the shards that may wait for their upload
    each = re.search(
        r"Each shard written from now on also leaves about (\d+(?:\.\d+)? [kMG]?B)", message
    )
    assert each, message
    shards = -(-whole // SHARD)  # the checkpoints of every shard, kept until close()
    _leave(disk, int(need * 1.2) + shards * parse_size(each[1]))
    write_all(url, overwrite=True, **options)
    remote = packer.open_dataset(url, storage_options=server.options)
    assert len(remote) == SAMPLES and remote[SAMPLES - 1]["txt"] == f"sample {SAMPLES - 1}"
