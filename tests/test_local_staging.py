"""Local staging (issue 42 item 2): a local dataset opened with ``cache_dir=`` / ``cache=True`` /
``cache_limit=`` is read through the node's shard cache, each shard copied in and checked by its
xxh3 as a URL's is, shared by every process, bounded by the limit; ``file://`` URLs open too.

Real LMDB and NPY datasets on the local disk, real DataLoader workers (fork and spawn); the
proof that a second epoch reads only the cache is the source renamed away before it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packer
from packer.core.manifest import load_manifest
from packer.demo.image import make_image_tree
from packer.errors import FormatError, PackerError
from packer.remote import cached_reader, storage
from packer.remote.cache import ShardCache, wait_for_downloads


@pytest.fixture(autouse=True)
def quick_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage, "RETRY", storage.Retry(attempts=2, base=0.01, cap=0.02))


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Images as LMDB and NPY, several shards each."""
    root = tmp_path_factory.mktemp("staging_src")
    images = make_image_tree(root / "images", classes=3, per_class=4, size=(64, 48), bad=0)
    out = {}
    for name in ("images.lmdb", "images.npy"):
        out[name] = root / name
        packer.convert(images.root, out[name], shard_size="6kB", workers=1, progress=False)
        assert len(load_manifest(out[name]).shards) >= 4
    return out


@pytest.fixture(params=["images.lmdb", "images.npy"])
def source(request: pytest.FixtureRequest, made: dict[str, Path], tmp_path: Path) -> Path:
    """A fresh copy of the dataset (a test may damage or move it)."""
    copy = tmp_path / "nfs" / request.param
    shutil.copytree(made[request.param], copy)
    return copy


def _all(dataset: object) -> list[tuple[bytes, int]]:
    out = []
    for i in range(len(dataset)):  # type: ignore[arg-type]
        image, label = dataset[i]  # type: ignore[index]
        out.append((np.asarray(image).tobytes(), int(label)))
    return out


def _cached(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.data"))


def _wait_for_shards() -> None:
    """Reads wait for their shard's checked copy (no record served from the source first)."""
    cached_reader.RANGED_SHARE, cached_reader.RANGED_FLOOR, cached_reader.AHEAD = 0.0, 0, 0


def _wait_in_worker(_: int) -> None:  # a spawned worker starts with the defaults
    _wait_for_shards()


def _moved_away(source: Path) -> Path:
    """The source renamed away (root reads a file whatever its mode: chmod would prove nothing)."""
    gone = source.with_name(source.name + ".gone")
    source.rename(gone)
    assert not source.exists()
    return gone


def test_staged_epoch_then_only_the_cache(source: Path, tmp_path: Path) -> None:
    expected = _all(packer.open_dataset(source))
    cache = tmp_path / "shm"
    dataset = packer.open_dataset(source, cache_dir=cache)
    assert _all(dataset) == expected
    assert wait_for_downloads(30)
    shards = load_manifest(source).shards
    assert len(_cached(cache)) == len(shards)
    urls = sorted(e.url for e in ShardCache(cache).entries())
    assert urls == sorted(f"file://{os.path.realpath(source)}/{s.name}" for s in shards)
    _moved_away(source)
    assert _all(dataset) == expected  # the second epoch: the cache alone
    dataset.close()
    assert _all(dataset) == expected  # reopened shards: from the cache again


def test_file_url_opens_plain_and_staged(source: Path, tmp_path: Path) -> None:
    expected = _all(packer.open_dataset(source))
    url = "file://" + str(source)
    plain = packer.open_dataset(url)
    assert not plain.reader.RANGED and _all(plain) == expected
    assert packer.open_dataset(f"file://localhost{source}", cache=False).root == source
    staged = packer.open_dataset(url, cache_dir=tmp_path / "c", cache_limit="10MB")
    assert str(staged.root).startswith("file://") and _all(staged) == expected
    assert wait_for_downloads(30) and len(_cached(tmp_path / "c")) >= 1


def test_missing_or_foreign_paths_are_clear_errors(tmp_path: Path, made: dict[str, Path]) -> None:
    missing = tmp_path / "nowhere.lmdb"
    for path in (str(missing), "file://" + str(missing)):
        with pytest.raises(PackerError, match="does not exist"):
            packer.open_dataset(path, cache_dir=tmp_path / "c")
    with pytest.raises(PackerError, match="does not exist"):
        packer.LMDBDataset(missing, cache_dir=tmp_path / "c")
    with pytest.raises(PackerError, match="names the host 'otherhost'"):
        packer.open_dataset(f"file://otherhost{made['images.lmdb']}", cache_dir=tmp_path / "c")
    with pytest.raises(PackerError, match="no absolute path"):
        packer.open_dataset("file:relative/images.lmdb", cache_dir=tmp_path / "c")
    with pytest.raises(FormatError, match="storage_options is for a URL"):
        packer.open_dataset(made["images.lmdb"], storage_options={}, cache_dir=tmp_path / "c")


def test_a_flipped_byte_is_refused_and_never_cached(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (("RANGED_SHARE", 0.0), ("RANGED_FLOOR", 0), ("AHEAD", 0)):
        monkeypatch.setattr(cached_reader, name, value)
    manifest = load_manifest(source)
    bad = manifest.shards[1]
    path = source / bad.name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # the same size: only the checksum tells
    path.write_bytes(bytes(data))
    cache = tmp_path / "shm"
    dataset = packer.open_dataset(source, cache_dir=cache)
    first_bad = sum(s.samples for s in manifest.shards[:1])
    assert dataset[0] is not None  # a sound shard reads
    with pytest.raises(FormatError, match="xxh3 differs from the manifest") as refused:
        dataset[first_bad]
    assert "damaged on its disk" in str(refused.value)
    keys = {e.url.rsplit("/", 1)[1] for e in ShardCache(cache).entries() if not e.partial}
    assert bad.name not in keys and manifest.shards[0].name in keys
    assert wait_for_downloads(30)  # a background copy of the bad shard may still be failing
    assert not list(cache.glob("*.part"))
    with pytest.raises(FormatError, match="xxh3 differs"):  # refused again, not served
        dataset[first_bad]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_share_one_copy_and_epoch_two_reads_the_cache(
    made: dict[str, Path], tmp_path: Path, context: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "nfs" / "images.lmdb"
    shutil.copytree(made["images.lmdb"], source)
    # set here for this process and a forked worker (undone after the test); a spawned worker
    # sets it in worker_init_fn
    for name, value in (("RANGED_SHARE", 0.0), ("RANGED_FLOOR", 0), ("AHEAD", 0)):
        monkeypatch.setattr(cached_reader, name, value)
    expected = [label for _, label in _all(packer.open_dataset(source))]
    cache = tmp_path / "shm"
    dataset = packer.open_dataset(source, cache_dir=cache, output="tensor")
    # batch k goes to worker k % 2: both workers read every shard
    loader = DataLoader(
        dataset,
        batch_size=1,
        num_workers=2,
        multiprocessing_context=context,
        worker_init_fn=_wait_in_worker,
        timeout=60,
    )
    labels = [int(y) for _, y in loader]
    assert labels == expected
    shards = load_manifest(source).shards
    entries = ShardCache(cache).entries()
    assert len(_cached(cache)) == len(shards) == len({e.url for e in entries})
    _moved_away(source)
    again = [(x.clone(), int(y)) for x, y in loader]
    assert [y for _, y in again] == expected
    assert all(isinstance(x, torch.Tensor) for x, _ in again)


def test_cache_limit_is_kept(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # no read-ahead: a shard held plus those copying ahead may pass a limit of two shards (the
    # cache exceeds its limit by the objects in use, as for a URL: packer/remote/cache.py)
    for name, value in (("RANGED_SHARE", 0.0), ("RANGED_FLOOR", 0), ("AHEAD", 0)):
        monkeypatch.setattr(cached_reader, name, value)
    shards = load_manifest(source).shards
    largest = max(s.bytes for s in shards)
    limit = 2 * largest
    cache = tmp_path / "shm"
    expected = _all(packer.open_dataset(source))
    dataset = packer.open_dataset(source, cache_dir=cache, cache_limit=limit)
    assert _all(dataset) == expected
    assert wait_for_downloads(30)
    dataset.close()
    kept = sum(p.stat().st_size for p in _cached(cache))
    assert 0 < kept <= limit < sum(s.bytes for s in shards)
    with pytest.raises(PackerError, match="smaller than the largest shard"):
        packer.open_dataset(source, cache_dir=cache, cache_limit=largest - 1)


def test_doctor_recommends_staging_with_a_command_that_works(
    made: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from packer.diagnosis import doctor as doctor_module

    source = made["images.lmdb"]
    report = doctor_module.doctor(source, batch_size=4, workers=0, budget_s=20)
    text = "\n".join(report.recommendations)
    assert "cp -r" not in text  # the advice is staging through the cache, not a copy by hand
    (line,) = [r for r in report.recommendations if "cache_dir=" in r]
    assert line.startswith("the dataset fits in RAM") and 'cache_dir="/dev/shm/packer"' in line
    command = line[line.index("packer.open_dataset(") :]
    monkeypatch.setattr(packer, "open_dataset", _in(tmp_path / "shm", packer.open_dataset))
    staged = eval(command, {"packer": packer})  # the command as printed, its cache moved here
    assert str(staged.root).startswith("file://") and _all(staged) == _all(
        packer.LMDBDataset(source)
    )
    assert wait_for_downloads(30) and len(_cached(tmp_path / "shm")) == len(
        load_manifest(source).shards
    )
    # a dataset larger than RAM on a disk slower than decode: staged on a local disk
    report.cold_read_ms = 10 * (report.split_ms["decode"] + report.split_ms["transform"]) + 1
    slow = doctor_module._staging(report, Path(source), False, Path("/dev/shm"))
    assert slow is not None and slow.startswith("the disk is the bottleneck")
    assert f'cache_dir="{doctor_module.packer_home()}"' in slow and "local SSD" in slow
    report.cold_read_ms = 0.0  # a fast disk, too large for RAM: read in place
    assert doctor_module._staging(report, Path(source), False, Path("/dev/shm")) is None


def _in(cache: Path, opener: object) -> object:
    """``opener`` with the cache folder the doctor names replaced by ``cache`` (a test writes
    nothing to the machine's /dev/shm)."""

    def opened(path: object, **options: object) -> object:
        assert options.pop("cache_dir") == "/dev/shm/packer"
        return opener(path, cache_dir=cache, **options)  # type: ignore[operator]

    return opened


def test_the_commands_take_a_file_url(made: dict[str, Path]) -> None:
    from click.testing import CliRunner

    from packer.cli import main

    url = made["images.lmdb"].absolute().as_uri()
    for command in ("inspect", "verify"):
        done = CliRunner().invoke(main, [command, url])
        assert done.exit_code == 0, (command, done.output)
        assert str(made["images.lmdb"].absolute()) in done.output, done.output
    other = CliRunner().invoke(main, ["inspect", url.replace("file://", "file://otherhost")])
    assert other.exit_code == 2 and "this machine's files only" in other.output, other.output
