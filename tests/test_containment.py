"""Attacks on a packed dataset's containment and snapshot guarantees (issue 18): crafted record
bounds, tables flipped bit by bit, FIFOs where files belong, symlinks at every level of the
dataset, split names that leave it, and a dataset converted again while it is open. Every attack
ends in one clear outcome: a FormatError naming what is wrong, or a finding of ``verify``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader, Dataset

import packer
from packer.cli.app import main
from packer.core import contained
from packer.core.manifest import (
    KEYS_NAME,
    MANIFEST_NAME,
    file_checksum,
    load_index,
    load_keys,
    load_manifest,
    load_records,
)
from packer.core.manifest_schema import trusted_digest
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.errors import FormatError
from packer.read.verify import verify


@pytest.fixture(scope="module")
def frames(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 classes × 2 short videos as frame folders."""
    root = tmp_path_factory.mktemp("vsrc") / "frames"
    return make_video_tree(root, frames=(4, 6), size=(64, 48)).root


@pytest.fixture(scope="module")
def videos(frames: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The videos converted into every per-sample format once (copied before any attack)."""
    out = tmp_path_factory.mktemp("vout")
    done = {}
    for suffix in (".bmp", ".h5", ".npy"):
        packer.convert(frames, out / f"v{suffix}", workers=1, progress=False)
        done[suffix] = out / f"v{suffix}"
    return done


def per_sample_files(root: Path) -> list[Path]:
    """The data files in the class folders (not the tables at the top)."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.parent != root)


def copy(packed: dict[str, Path], suffix: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed[suffix], tmp_path / f"x{suffix}"))


def seal(root: Path) -> None:
    """Record the tables' current checksums in the manifest, as a crafted output would."""
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["files"] = {name: file_checksum(root / name) for name in data["files"]}
    (root / MANIFEST_NAME).write_text(json.dumps(data))


def craft_record(root: Path, row: int, offset: int) -> None:
    records = load_records(root, load_index(root, load_manifest(root)))
    records = np.array(records)
    records["offset"][row] = offset
    np.save(root / "records.npy", records)
    seal(root)


@pytest.mark.parametrize("suffix", [".h5", ".lmdb", ".npy"])
def test_an_offset_near_2_63_cannot_wrap_past_the_bounds(
    packed: dict[str, Path], tmp_path: Path, suffix: str
) -> None:
    root = copy(packed, suffix, tmp_path)
    craft_record(root, 5, 2**63 - 10)
    with pytest.raises(FormatError, match="record lies outside its file .row 5"):
        packer.open_dataset(root, output="bytes")


@pytest.mark.parametrize("suffix", [".h5", ".lmdb", ".npy"])
@pytest.mark.parametrize("over", [1, 3])
def test_a_record_overrunning_its_shard_by_a_few_bytes(
    packed: dict[str, Path], tmp_path: Path, suffix: str, over: int
) -> None:
    root = copy(packed, suffix, tmp_path)
    manifest = load_manifest(root)
    records = load_records(root, load_index(root, manifest))
    row = len(records) - 1
    size = manifest.shards[int(records["file"][row])].bytes
    craft_record(root, row, size - int(records["length"][row]) + over)
    with pytest.raises(FormatError, match=f"record lies outside its file .row {row}"):
        packer.open_dataset(root, output="bytes")
    craft_record(root, row, size - int(records["length"][row]))  # ends at the last byte: fine
    packer.open_dataset(root, output="bytes")


TABLES = ["index.npy", "records.npy", "keys.txt"]


@pytest.mark.parametrize("suffix", [".bmp", ".lmdb", ".npy"])
@pytest.mark.parametrize("name", TABLES)
def test_one_flipped_bit_in_a_table_is_refused_at_open(
    packed: dict[str, Path], tmp_path: Path, suffix: str, name: str
) -> None:
    root = copy(packed, suffix, tmp_path)
    table = root / name
    sound = table.read_bytes()
    for position in (0, 9, len(sound) // 2, len(sound) - 1):  # magic, header, a row, the end
        for bit in (0, 7):
            raw = bytearray(sound)
            raw[position] ^= 1 << bit
            table.write_bytes(bytes(raw))
            with pytest.raises(FormatError, match=f"{name}' differs from the checksum"):
                packer.open_dataset(root, output="bytes")
    table.write_bytes(sound)
    assert len(packer.open_dataset(root, output="bytes")) == len(
        load_index(root, load_manifest(root))
    )


OPEN_AND_READ = """
import sys
import packer
from packer.core import contained
try:
    dataset = packer.open_dataset(sys.argv[1], output="bytes")
    [dataset[i] for i in range(len(dataset))]
except packer.PackerError as exc:
    print(exc)
    sys.exit(3)
"""


def run_briefly(*args: str, fifo: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python args`` (beside a watch on ``fifo`` if given): every 2 s while it runs, a
    writer's non-blocking open finds whether a reader holds the FIFO open (a reader blocked in
    its open, or in a read of it: a hang); such a reader is released (the open-then-close gives
    it an end of file) and the run fails. A slow run is never a failure; a cap of 600 s, which
    only a hang elsewhere reaches, kills it."""
    env = {**os.environ, "PYTHONPATH": str(Path(packer.__file__).parents[1])}
    child = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    held = 0
    for _ in range(300):
        try:
            out, err = child.communicate(timeout=2)
            break
        except subprocess.TimeoutExpired:
            if fifo is None:
                continue
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                held += 1  # a reader had it open: released
            except OSError:  # ENXIO: no reader, the run is only slow
                pass
    else:
        child.kill()
        out, err = child.communicate()
        pytest.fail(f"{args} still running after 600 s")
    assert held == 0, f"{args} held the FIFO {fifo} open for reading (a hang on a FIFO)"
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def replace_by_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("name", TABLES)
def test_a_fifo_named_like_a_table_never_hangs(
    packed: dict[str, Path], tmp_path: Path, name: str
) -> None:
    root = copy(packed, ".npy", tmp_path)
    fifo = root / name
    replace_by_fifo(fifo)
    opened = run_briefly("-c", OPEN_AND_READ, str(root), fifo=fifo)
    assert opened.returncode == 3 and "is not a regular file" in opened.stdout, opened
    done = run_briefly("-m", "packer", "verify", str(root), fifo=fifo)
    assert done.returncode == 1 and "not a regular file" in done.stdout + done.stderr, done
    shown = run_briefly(
        "-m", "packer", "inspect", str(root), fifo=fifo
    )  # inspect never reads records
    if name != "records.npy":
        assert shown.returncode == 1 and "not a regular file" in shown.stderr, shown


@pytest.mark.parametrize("suffix", [".bmp", ".h5", ".npy"])
def test_a_fifo_as_a_per_sample_file_never_hangs(
    videos: dict[str, Path], tmp_path: Path, suffix: str
) -> None:
    root = copy(videos, suffix, tmp_path)
    victim = per_sample_files(root)[0]
    replace_by_fifo(victim)
    opened = run_briefly("-c", OPEN_AND_READ, str(root), fifo=victim)
    assert opened.returncode == 3 and "is not a regular file" in opened.stdout, opened
    done = run_briefly("-m", "packer", "verify", str(root), fifo=victim)
    assert done.returncode == 1 and "regular file" in done.stdout, done


def cli_verify(root: Path) -> str:
    """``packer verify ROOT``: it must exit 1; its output."""
    result = CliRunner().invoke(main, ["verify", "--quiet", str(root)])
    assert result.exit_code == 1, result.output
    return result.output


def read_all(root: Path, **kwargs: object) -> None:
    dataset = packer.open_dataset(root, output="bytes", **kwargs)
    for i in range(len(dataset)):
        dataset[i]


def class_folder_linked_away(root: Path, tmp_path: Path) -> Path:
    """Replace a class folder by a link to a look-alike folder outside the dataset (same
    names, other bytes); return the outside folder."""
    victim = sorted(p for p in root.iterdir() if p.is_dir())[0]
    outside = Path(shutil.copytree(victim, tmp_path / "elsewhere"))
    for f in outside.rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[:-8] + b"OUTSIDE!")
    shutil.rmtree(victim)
    victim.symlink_to(outside, target_is_directory=True)
    return outside


@pytest.mark.parametrize("suffix", [".bmp", ".h5", ".npy"])
def test_a_class_folder_linked_out_of_a_video_dataset(
    videos: dict[str, Path], tmp_path: Path, suffix: str
) -> None:
    root = copy(videos, suffix, tmp_path)
    class_folder_linked_away(root, tmp_path)
    with pytest.raises(FormatError, match="is a symbolic link inside the dataset"):
        read_all(root)
    assert "a symbolic link (to " in cli_verify(root)


def test_a_class_folder_linked_out_of_an_image_bmp_dataset(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    root = copy(packed, ".bmp", tmp_path)
    class_folder_linked_away(root, tmp_path)
    with pytest.raises(FormatError, match="is a symbolic link inside the dataset"):
        read_all(root)
    report = verify(root, progress=False)
    assert not report.ok and any("symbolic link" in p.what for p in report.problems)
    assert "a symbolic link (to " in cli_verify(root)


@pytest.mark.parametrize("name", TABLES)
def test_a_table_linked_to_another_datasets_identical_table(
    packed: dict[str, Path], tmp_path: Path, name: str
) -> None:
    root = copy(packed, ".npy", tmp_path)
    other = Path(shutil.copytree(root, tmp_path / "other.npy"))  # same bytes: same checksum
    (root / name).unlink()
    (root / name).symlink_to(other / name)
    with pytest.raises(FormatError, match="is a symbolic link inside the dataset"):
        packer.open_dataset(root, output="bytes")
    assert f"{name}: a symbolic link" in cli_verify(root)


@pytest.fixture(scope="module")
def splits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An LMDB output of a train/val source (a ``splits`` manifest)."""
    src = tmp_path_factory.mktemp("ssrc") / "src"
    for split in ("train", "val"):
        make_image_tree(src / split, classes=2, per_class=2, size=(64, 48), bad=0)
    out = tmp_path_factory.mktemp("sout") / "s.lmdb"
    packer.convert(src, out, workers=1, progress=False)
    return out


def test_a_split_folder_linked_to_another_dataset(splits: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(splits, tmp_path / "s.lmdb"))
    other = Path(shutil.copytree(root / "train", tmp_path / "victim.lmdb"))
    shutil.rmtree(root / "val")
    (root / "val").symlink_to(other, target_is_directory=True)
    with pytest.raises(FormatError, match="'val' is a symbolic link inside the dataset"):
        packer.open_dataset(root, split="val")
    assert len(packer.open_dataset(root, split="train")) == 4  # the real split still opens
    assert "val: a symbolic link (to " in cli_verify(root)


@pytest.mark.parametrize("name", ["../victim.lmdb", "ABSOLUTE", "val/../../victim.lmdb", ""])
def test_split_names_that_leave_the_output(splits: Path, tmp_path: Path, name: str) -> None:
    root = Path(shutil.copytree(splits, tmp_path / "s.lmdb"))
    victim = Path(shutil.copytree(root / "train", tmp_path / "victim.lmdb"))
    name = str(victim) if name == "ABSOLUTE" else name
    data = json.loads((root / MANIFEST_NAME).read_text())
    data["options"]["splits"] = {name: 4, "train": 4}
    data["trusted_xxh3_64"] = trusted_digest(data)  # crafted: its checksum signed again
    (root / MANIFEST_NAME).write_text(json.dumps(data))
    refused = "plain|expected non-empty names"  # an empty name is refused by the manifest check
    with pytest.raises(FormatError, match=refused):
        packer.open_dataset(root, split=name)
    out = cli_verify(root)
    assert re.search(refused, out) and "victim" not in out.replace(repr(name), "")


@pytest.fixture(params=["openat2", "walk"])
def opener(request: pytest.FixtureRequest) -> object:
    """Both ways ``packer.core.contained`` opens: the kernel's openat2, and the per-component walk
    used where the kernel lacks it (forced here by marking openat2 unavailable)."""
    saved = list(contained._openat2)
    if request.param == "walk":
        contained._openat2[:] = [None]
    elif contained._syscall() is None:
        pytest.skip("no openat2 on this system")
    yield request.param
    contained._openat2[:] = saved


def test_open_beneath_refuses_links_at_every_level(tmp_path: Path, opener: object) -> None:
    root = tmp_path / "d"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_bytes(b"inside")
    (tmp_path / "out" / "b").mkdir(parents=True)
    (tmp_path / "out" / "b" / "f").write_bytes(b"outside")
    (root / "link").symlink_to(tmp_path / "out", target_is_directory=True)
    (root / "a" / "inner").symlink_to(root / "a" / "b", target_is_directory=True)  # even inside
    (root / "a" / "b" / "g").symlink_to(root / "a" / "b" / "f")
    os.mkfifo(root / "a" / "fifo")
    fd = contained.open_folder(root)
    try:
        got = contained.open_beneath(fd, "a/b/f", root)
        assert os.read(got, 100) == b"inside"
        os.close(got)
        for name, why in [
            ("link/b/f", "'link' is a symbolic link"),
            ("a/inner/f", "'a/inner' is a symbolic link"),
            ("a/b/g", "'a/b/g' is a symbolic link"),
            ("a/fifo", "not a regular file"),
            ("a/b", "not a regular file"),
            ("a/../a/b/f", "not a plain relative name"),
            (str(root / "a/b/f"), "not a plain relative name"),
            ("a//b/f", "not a plain relative name"),
            ("a/b/f\0", "not a plain relative name"),
        ]:
            with pytest.raises(FormatError, match=why):
                contained.open_beneath(fd, name, root)
        with pytest.raises(FormatError, match="'link' is a symbolic link"):
            contained.open_beneath(fd, "link", root, folder=True)
        os.close(contained.open_beneath(fd, "a/b", root, folder=True))
    finally:
        os.close(fd)


def test_a_linked_class_folder_is_refused_by_both_openers(
    packed: dict[str, Path], tmp_path: Path, opener: object
) -> None:
    root = copy(packed, ".bmp", tmp_path)
    class_folder_linked_away(root, tmp_path)
    with pytest.raises(FormatError, match="is a symbolic link inside the dataset"):
        read_all(root)


def test_a_relative_link_from_one_class_folder_to_another_is_refused_by_both_openers(
    packed: dict[str, Path], tmp_path: Path, opener: object
) -> None:
    """Issue 28, 14: ``class_01 -> class_00`` (a relative link that stays inside the dataset,
    which ``RESOLVE_BENEATH`` alone lets through, unlike an absolute one) would serve class_00's
    images under class_01's names and labels. Refused by openat2's ``RESOLVE_NO_SYMLINKS`` and
    by the walk's ``O_NOFOLLOW`` on folders, before a byte is read."""
    root = copy(packed, ".bmp", tmp_path)
    first, second = sorted(p for p in root.iterdir() if p.is_dir())[:2]
    dataset = packer.open_dataset(root, output="bytes")
    names = [dataset.keys[i] for i in range(len(dataset))]
    assert sorted(p.name for p in first.iterdir()) == sorted(p.name for p in second.iterdir())
    shutil.rmtree(second)
    second.symlink_to(first.name, target_is_directory=True)  # relative: inside the dataset
    assert (second / next(first.iterdir()).name).read_bytes()  # the link does resolve
    linked = packer.open_dataset(root, output="bytes")
    refused = []
    for i in range(len(linked)):
        try:
            linked[i]
        except FormatError as exc:
            assert f"{second.name!r} is a symbolic link inside the dataset" in str(exc)
            refused.append(names[i])
    assert refused and refused == [n for n in names if n.startswith(f"{second.name}/")]
    assert "symbolic link" in cli_verify(root)


class KeyedSamples(Dataset):  # type: ignore[type-arg]
    """Each item as its key (``keys_only``) or (key, label): what a training loop writes
    predictions by."""

    def __init__(self, dataset: Any, keys_only: bool) -> None:
        self.dataset = dataset
        self.keys_only = keys_only

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> Any:
        if self.keys_only:
            return self.dataset.keys[i]
        return self.dataset.keys[i], int(self.dataset[i][1])


@pytest.fixture(scope="module")
def other_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another image tree: other class names, so other keys (``zebra_00/...``)."""
    root = tmp_path_factory.mktemp("other") / "images"
    make_image_tree(root, classes=2, per_class=3, size=(64, 48), bad=0, seed=7)
    for folder in sorted(root.iterdir()):
        folder.rename(root / folder.name.replace("class", "zebra"))
    return root


def manifest_keys(root: Path) -> list[str]:
    return load_keys(root, load_manifest(root))


def convert_again(src: Path, dst: Path) -> None:
    """A real ``packer convert SRC DST --overwrite`` in its own process."""
    done = run_briefly("-m", "packer", "convert", str(src), str(dst), "--overwrite", "-q")
    assert done.returncode == 0, done
    assert load_manifest(dst).classes == ["zebra_00", "zebra_01"]


def test_keys_stay_those_of_the_opened_dataset_after_an_overwrite(
    packed: dict[str, Path], other_source: Path, tmp_path: Path, suffix: str
) -> None:
    root = copy(packed, suffix, tmp_path)
    old_keys = manifest_keys(packed[suffix])  # the original's: this dataset's keys untouched
    dataset = packer.open_dataset(root, output="bytes")
    samples = [dataset[i] for i in range(len(dataset))]  # (bytes, label) as opened
    convert_again(other_source, root)
    assert dataset.keys[0] == old_keys[0] and list(dataset.keys) == old_keys
    try:  # the old sample, or a clear refusal: never the new output's bytes under old keys
        assert [dataset[i] for i in range(len(dataset))] == samples
    except FormatError as exc:
        assert "replaced after the dataset was opened" in str(exc)


def load_keys_through(dataset: Any, context: str, keys_only: bool) -> list[Any]:
    loader = DataLoader(
        KeyedSamples(dataset, keys_only),
        batch_size=2,
        # spawn: one worker. With two, the first one's refusal shuts the loader down while the
        # second may still be starting (importing torch); torch then reports that worker's
        # exit as a RuntimeError from the iterator's __del__ — a race of torch's, not packer's.
        num_workers=1 if context == "spawn" else 2,
        multiprocessing_context=context,
        collate_fn=list,
    )
    batches = iter(loader)
    try:
        return [item for batch in batches for item in batch]
    except FormatError as exc:
        message = str(exc)
    # Raised anew, outside the handler: the worker's traceback (which holds the iterator) is
    # gone, so the workers shut down now, not whenever pytest lets the traceback go.
    del batches
    raise FormatError(message)


@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_workers_started_after_an_overwrite_refuse_to_mix(
    packed: dict[str, Path], other_source: Path, tmp_path: Path, suffix: str, context: str
) -> None:
    root = copy(packed, suffix, tmp_path)
    old_keys = manifest_keys(packed[suffix])
    dataset = packer.open_dataset(root, output="bytes")
    dataset[0]
    convert_again(other_source, root)
    if context == "fork":  # the keys mapped at open are inherited: the old ones
        assert load_keys_through(dataset, context, keys_only=True) == old_keys
    else:  # a spawned worker maps keys.txt again: the folder is not the one opened
        with pytest.raises(FormatError, match="replaced after the dataset was opened"):
            load_keys_through(dataset, context, keys_only=True)
    with pytest.raises(FormatError, match="replaced after the dataset was opened"):
        load_keys_through(dataset, context, keys_only=False)  # samples: never the new output's


def test_keys_rewritten_in_place_are_refused_by_a_worker_that_maps_them_again(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    """Issue 28, 14: ``keys.txt`` rewritten in place under an open dataset, same size, same
    inode, other bytes (``class_00`` → ``class_99``): only its modification time tells. A
    process that maps it again (a spawned DataLoader worker) refuses it instead of naming
    samples by the new keys; a fresh open refuses it by the manifest's checksum."""
    root = copy(packed, ".lmdb", tmp_path)
    dataset = packer.open_dataset(root, output="bytes")
    old = list(dataset.keys)
    keys = root / KEYS_NAME
    data, before = keys.read_bytes(), keys.stat()
    with open(keys, "r+b") as fh:  # in place: no new inode, no new size
        fh.write(data.replace(b"class_00", b"class_99"))
    # a rewrite a second later (set, not slept for: a write within the file system's clock
    # tick keeps the old time, however long or short a sleep the machine gave)
    os.utime(keys, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert keys.stat().st_ino == before.st_ino and keys.stat().st_size == len(data)
    assert keys.stat().st_mtime_ns > before.st_mtime_ns
    assert keys.read_bytes() != data
    with pytest.raises(FormatError, match="keys.txt' was replaced after the dataset was opened"):
        load_keys_through(dataset, "spawn", keys_only=True)
    with pytest.raises(FormatError, match="keys.txt' differs from the checksum"):
        packer.open_dataset(root, output="bytes")
    assert len(old) == len(dataset)


def test_a_manifest_linked_to_another_datasets(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy(packed, ".npy", tmp_path)
    other = Path(shutil.copytree(root, tmp_path / "other.npy"))
    (root / MANIFEST_NAME).unlink()
    (root / MANIFEST_NAME).symlink_to(other / MANIFEST_NAME)
    with pytest.raises(FormatError, match="packer.json' is a symbolic link"):
        packer.open_dataset(root, output="bytes")
    assert "packer.json: a symbolic link" in cli_verify(root)


def test_verify_reports_a_socket_inside_a_dataset(videos: dict[str, Path], tmp_path: Path) -> None:
    """A socket (like a FIFO or device) has no place in a dataset: verify names it, exit 1."""
    import socket

    root = copy(videos, ".bmp", tmp_path)
    folder = per_sample_files(root)[0].parent
    server = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(folder)  # a short relative name: AF_UNIX paths are limited to 108 bytes
    try:
        server.bind("s")
    finally:
        os.chdir(cwd)
    try:
        out = cli_verify(root)
    finally:
        server.close()
    assert "a FIFO, device or socket where only folders and regular files belong" in out
    assert "/s" in out
