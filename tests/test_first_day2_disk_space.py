"""Issue 42 item 3: a conversion the destination cannot hold is refused before any work (the
estimate within ±20 % of the space each format really takes, measured on a small tmpfs), and a
disk full at any point — already full at the start included — is one DestinationError saying
how much is needed and that --resume continues."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import packer
from packer.demo.image import make_image_tree
from packer.errors import DestinationError
from packer.write.disk_full import estimate_output
from packer.write.plan import plan_conversion

SUFFIXES = (".lmdb", ".npy", ".h5", ".bmp")


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MB tmpfs, unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(
            "SKIPPED LOUDLY: cannot mount a tmpfs here (not root?), so the disk-space tests "
            f"cannot run: {done.stderr.decode().strip()}"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("space") / "images"
    make_image_tree(root, classes=3, per_class=15, size=(160, 120), bad=0)
    return root


def _fill(disk: Path, leave: int) -> None:
    """Fill ``disk`` until only ``leave`` bytes are free."""
    free = shutil.disk_usage(disk).free
    (disk / "ballast").write_bytes(b"\0" * max(free - leave, 0))


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_estimate_within_20_percent_of_the_space_taken(
    source: Path, disk: Path, suffix: str
) -> None:
    dst = disk / f"out{suffix}"
    plan = plan_conversion(source, dst, progress=False)
    block = shutil.os.statvfs(disk).f_frsize  # type: ignore[attr-defined]
    estimate = estimate_output(plan.format, plan.prepared.source, plan.options, block)
    before = shutil.disk_usage(disk).used
    packer.convert(source, dst, progress=False, workers=1)
    taken = shutil.disk_usage(disk).used - before
    assert estimate is not None and 0.8 * taken <= estimate <= 1.2 * taken, (estimate, taken)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_conversion_that_cannot_fit_is_refused_before_any_work(
    source: Path, disk: Path, suffix: str
) -> None:
    dst = disk / f"out{suffix}"
    plan = plan_conversion(source, dst, progress=False)
    estimate = estimate_output(plan.format, plan.prepared.source, plan.options, 4096)
    assert estimate is not None
    _fill(disk, int(estimate * 0.6))
    with pytest.raises(DestinationError, match="is needed.*--resume") as error:
        packer.convert(source, dst, progress=False, workers=1)
    assert "not enough space" in str(error.value)
    assert not dst.exists() and not (disk / f"out{suffix}.partial").exists()


@pytest.mark.parametrize("options", [{}, {"max_side": 64}], ids=["checked", "unestimated"])
def test_a_disk_already_full_at_the_start_is_one_destination_error(
    source: Path, disk: Path, options: dict
) -> None:
    _fill(disk, 0)
    with pytest.raises(DestinationError, match=r"is needed.*--resume"):
        packer.convert(source, disk / "out.lmdb", progress=False, workers=1, **options)


def test_a_disk_filling_mid_conversion_says_resume_continues(source: Path, disk: Path) -> None:
    """The estimate can't see another writer: the disk fills while the conversion runs."""
    dst = disk / "out.bmp"
    with pytest.raises(DestinationError, match=r"disk full.*more is needed.*--resume"):
        packer.convert(
            source,
            dst,
            progress=False,
            workers=1,
            shard_size="4kB",
            on_event=lambda name, number: _fill(disk, 0) if name == "shard" else None,
        )
    assert (disk / "out.bmp.partial").is_dir()


@pytest.mark.parametrize("keep", [False, True], ids=["streamed", "kept"])
def test_a_full_staging_folder_of_an_upload_is_one_destination_error(
    server: object, source: Path, disk: Path, keep: bool
) -> None:
    """The upload's staging folder on a disk already full: the same one error, naming the
    staging folder, how much is needed and --resume; nothing bare."""
    from click.testing import CliRunner

    from packer.cli.app import main

    _fill(disk, 0)
    url = f"s3://write/full{int(keep)}.lmdb"
    args = ["convert", str(source), url, "-q", "--workers", "1", "--staging", str(disk)]
    args += ["--storage-option", f"endpoint_url={server.endpoint}"]  # type: ignore[attr-defined]
    result = CliRunner().invoke(main, args + (["--keep-staging"] if keep else []))
    assert result.exit_code == 1, result.output
    assert "internal error" not in result.output and "needed" in result.output
    assert "--resume" in result.output and "staging" in result.output
