"""Hostile inputs and damaged or crafted outputs: each ends in one clear outcome — a refusal, a
skip with its reason, or a finding — never a crash, a hang, or bytes from outside the dataset."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
from torch.utils.data import DataLoader

import packer
from packer.core.manifest import (
    KEYS_NAME,
    MANIFEST_NAME,
    file_checksum,
    load_index,
    load_manifest,
    load_records,
)
from packer.decode import registry as decoders
from packer.demo.image import DemoTree
from packer.errors import FormatError, InputFileError
from packer.read.verify import verify

OUTSIDE = b"SECRET-OUTSIDE-THE-DATASET" * 100


def copy(packed: dict[str, Path], suffix: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(packed[suffix], tmp_path / f"x{suffix}"))


def edit_manifest(root: Path, change) -> None:  # type: ignore[no-untyped-def]
    data = json.loads((root / MANIFEST_NAME).read_text())
    change(data)
    (root / MANIFEST_NAME).write_text(json.dumps(data))


def seal(root: Path) -> None:
    """Record the tables' current checksums in the manifest, as a crafted output would: the
    attack then reaches the checks behind the checksums."""
    edit_manifest(
        root, lambda d: d["files"].update({n: file_checksum(root / n) for n in d["files"]})
    )


@pytest.mark.parametrize("name", ["../../outside.npy", "/tmp/outside.npy", "sub/shard-00000.npy"])
def test_shard_names_that_leave_the_folder(
    packed: dict[str, Path], tmp_path: Path, name: str
) -> None:
    root = copy(packed, ".npy", tmp_path)
    (tmp_path / "outside.npy").write_bytes(OUTSIDE)
    edit_manifest(root, lambda d: d["shards"][0].update(name=name))
    with pytest.raises(FormatError, match="not a plain shard file name"):
        packer.open_dataset(root)
    report = verify(root, progress=False)
    assert not report.ok and "not a plain file name" in report.summary()


def test_a_shard_symlinked_out_of_the_folder(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy(packed, ".npy", tmp_path)
    shard = root / load_manifest(root).shards[0].name
    outside = tmp_path / "outside.bin"
    outside.write_bytes(shard.read_bytes())  # same size and bytes: only the link is wrong
    shard.unlink()
    shard.symlink_to(outside)
    with pytest.raises(FormatError, match="not a regular file"):
        packer.open_dataset(root)
    assert "not a regular file" in verify(root, progress=False).summary()


def test_keys_that_name_files_outside(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy(packed, ".bmp", tmp_path)
    keys = (root / KEYS_NAME).read_text().split("\n")
    keys[0] = str(tmp_path / "outside")  # an absolute key: would read /.../outside.bmp
    (tmp_path / "outside.bmp").write_bytes(OUTSIDE)
    (root / KEYS_NAME).write_text("\n".join(keys))
    with pytest.raises(FormatError, match="keys.txt' differs from the checksum"):
        packer.open_dataset(root, output="bytes")
    seal(root)
    with pytest.raises(FormatError, match="not a plain relative name"):
        packer.open_dataset(root, output="bytes")[0]
    assert not verify(root, progress=False).ok


def test_hdf5_external_storage_is_never_followed(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy(packed, ".h5", tmp_path)
    outside = tmp_path / "passwd"
    outside.write_bytes(OUTSIDE)
    shard = root / load_manifest(root).shards[0].name
    size = shard.stat().st_size
    shard.unlink()
    with h5py.File(shard, "w") as fh:  # /data stored in a file outside the dataset
        fh.create_dataset(
            "data", shape=(len(OUTSIDE),), dtype=np.uint8, external=[(outside, 0, len(OUTSIDE))]
        )
    edit_manifest(root, lambda d: d["shards"][0].update(bytes=shard.stat().st_size))
    assert shard.stat().st_size != size
    try:
        dataset = packer.open_dataset(root, output="bytes")
        got = [
            dataset[i][0] for i in range(len(dataset)) if dataset.reader.file[dataset.first[i]] == 0
        ]
    except FormatError as exc:  # records past the new, smaller shard
        assert "outside its file" in str(exc)
        got = []
    assert all(b"SECRET" not in g for g in got)
    assert not verify(root, progress=False).ok


def test_labels_and_offsets_out_of_range(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy(packed, ".npy", tmp_path)
    manifest = load_manifest(root)
    index = load_index(root, manifest)
    index["label"][3] = len(manifest.classes)
    np.save(root / "index.npy", index)
    with pytest.raises(FormatError, match="index.npy' differs from the checksum"):
        packer.open_dataset(root)
    seal(root)
    with pytest.raises(FormatError, match="label outside the 3 classes .row 3"):
        packer.open_dataset(root)
    root = copy(packed, ".lmdb", tmp_path / "b")
    manifest = load_manifest(root)
    records = load_records(root, load_index(root, manifest))
    records["offset"][5] = 10**9
    np.save(root / "records.npy", records)
    with pytest.raises(FormatError, match="records.npy' differs from the checksum"):
        packer.open_dataset(root)
    assert "records.npy: checksum differs" in verify(root, progress=False).summary()
    seal(root)  # a crafted output updates its checksums too
    with pytest.raises(FormatError, match="record lies outside its file .row 5"):
        packer.open_dataset(root)
    assert "tables: " in verify(root, progress=False).summary()


FLIP_AND_VERIFY = """
import sys
from packer.read.verify import verify
report = verify(sys.argv[1], progress=False)
print(report.summary())
sys.exit(0 if report.ok else 1)
"""


def test_one_bit_flipped_in_an_lmdb_page(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy(packed, ".lmdb", tmp_path)
    shard = root / load_manifest(root).shards[0].name
    raw = bytearray(shard.read_bytes())
    for page in range(2, len(raw) // 4096):  # a bit in every page past the two meta pages
        raw[page * 4096 + 20] ^= 0x10
    shard.write_bytes(bytes(raw))
    done = subprocess.run(
        [sys.executable, "-c", FLIP_AND_VERIFY, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, (done.returncode, done.stderr)  # a finding, not a signal
    assert "checksum differs" in done.stdout and "were not read" in done.stdout


@pytest.mark.parametrize("suffix", [".lmdb", ".npy", ".h5"])
@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_truncated_or_missing_shard(
    packed: dict[str, Path], tmp_path: Path, suffix: str, damage: str
) -> None:
    root = copy(packed, suffix, tmp_path)
    shard = root / load_manifest(root).shards[0].name
    if damage == "missing":
        shard.unlink()
    else:
        os.truncate(shard, shard.stat().st_size // 2)
    report = verify(root, progress=False)
    lines = [str(p) for p in report.problems]
    assert len(lines) == 2 and all(line.startswith(shard.name) for line in lines)  # per shard
    with pytest.raises(FormatError, match=shard.name):
        packer.open_dataset(root)


def test_a_truncated_video_file_in_a_worker(tmp_path: Path) -> None:
    from packer.demo.video import make_video_tree

    tree = make_video_tree(tmp_path / "v", classes=1, per_class=3, frames=(6, 8))
    dst = tmp_path / "v.npy"
    packer.convert(tree.root, dst, progress=False)
    dataset = packer.open_dataset(dst, num_frames=4, output="bytes")
    victim = dst / (dataset.keys[1] + ".npy")
    os.truncate(victim, victim.stat().st_size // 3)
    loader = DataLoader(dataset, batch_size=1, num_workers=2, collate_fn=list)
    with pytest.raises(FormatError, match="truncated"):
        list(loader)


def test_a_fifo_as_a_shard_never_hangs(packed: dict[str, Path], tmp_path: Path) -> None:
    root = copy(packed, ".npy", tmp_path)
    shard = root / load_manifest(root).shards[0].name
    shard.unlink()
    os.mkfifo(shard)
    with pytest.raises(FormatError, match="not a regular file"):
        packer.open_dataset(root)
    assert "not a regular file" in verify(root, progress=False).summary()


def png_of_pixels(width: int, height: int) -> bytes:
    """A valid grayscale PNG of ``width``×``height`` zeros, built by hand (tiny on disk)."""
    import struct

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    raw = zlib.compress(b"\x00" * (width + 1) * height, 9)
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", raw) + chunk(b"IEND", b"")


def test_unbounded_and_hostile_inputs_are_skipped(tree: DemoTree, tmp_path: Path) -> None:
    src = Path(shutil.copytree(tree.root, tmp_path / "src"))
    odd = src / "class_00"
    (odd / "huge.png").write_bytes(png_of_pixels(12000, 12000))  # 144 Mpx, ~140 KB
    with open(odd / "sparse.jpg", "wb") as fh:  # 2 GB, never read
        fh.truncate(2 << 30)
    (odd / "ghost.jpg").write_bytes(
        b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    )
    os.mkfifo(odd / "pipe.jpg")
    result = packer.convert(src, tmp_path / "out.lmdb", progress=False)
    reasons = {Path(s.path).name: s.reason for s in result.skipped}
    assert "144 Mpx, over the 90 Mpx limit" in reasons["huge.png"]
    assert "over the 64 MB limit" in reasons["sparse.jpg"]
    assert "not an image Pillow can identify" in reasons["ghost.jpg"]
    assert "not a file" in reasons["pipe.jpg"]
    assert len(packer.open_dataset(tmp_path / "out.lmdb")) == len(tree.good)


def test_decoding_refuses_images_over_the_pixel_limit(
    packed: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(decoders, "MAX_PIXELS", 100)
    dataset = packer.open_dataset(packed[".lmdb"])
    with pytest.raises(InputFileError, match="over the 100 px limit"):
        dataset[0]
    report = verify(packed[".lmdb"], full=True, progress=False)
    assert not report.ok and "does not decode" in report.summary()


def test_names_with_line_breaks_and_colliding_stems(tree: DemoTree, tmp_path: Path) -> None:
    src = tmp_path / "src"
    data = tree.good[0].read_bytes()
    for cls in ("two\nlines", "plain"):
        (src / cls).mkdir(parents=True)
        for name in ("a.jpg", "a.png", "a.png.jpg", "back\\slash.jpg", "c\rr.jpg"):
            (src / cls / name).write_bytes(data)
    for suffix in (".npy", ".bmp"):
        dst = tmp_path / f"out{suffix}"
        packer.convert(src, dst, progress=False)
        dataset = packer.open_dataset(dst, output="numpy")
        keys = list(dataset.keys)
        assert len(keys) == len(set(keys)) == 10
        assert "two\nlines/a.png" in keys and "plain/c\rr" in keys
        assert sorted(k for k in keys if k.startswith("plain/a")) == [
            "plain/a.jpg",
            "plain/a.png",
            "plain/a.png~2",
        ]
        assert all(dataset[i][0].shape == (48, 64, 3) for i in range(len(dataset)))
        assert verify(dst, progress=False).ok
    bmp_files = list((tmp_path / "out.bmp").rglob("*.bmp"))
    assert len(bmp_files) == 10  # no BMP overwrote another


def test_a_huge_input_plans_no_space(tree: DemoTree, tmp_path: Path) -> None:
    """A 2 GB file skipped by --max-file-size reserves nothing: the HDF5 shard stays small."""
    src = Path(shutil.copytree(tree.root, tmp_path / "src"))
    with open(src / "class_01" / "sparse.jpg", "wb") as fh:
        fh.truncate(2 << 30)
    result = packer.convert(src, tmp_path / "out.h5", progress=False)
    assert sum(s.bytes for s in result.manifest.shards) < 10 << 20
    assert len(packer.open_dataset(tmp_path / "out.h5")) == len(tree.good)


def test_a_file_growing_during_an_hdf5_conversion(tree: DemoTree, tmp_path: Path) -> None:
    src = Path(shutil.copytree(tree.root, tmp_path / "src"))
    victim = sorted((src / "class_01").iterdir())[0]

    def grow(name: str, number: int) -> None:
        if name == "sample" and number == 0:  # after the scan, before the victim is read
            with open(victim, "ab") as fh:
                fh.write(b"\0" * 64)

    result = packer.convert(src, tmp_path / "out.h5", workers=1, progress=False, on_event=grow)
    reasons = {Path(s.path).name: s.reason for s in result.skipped}
    assert "changed during the conversion" in reasons[victim.name]
    assert verify(tmp_path / "out.h5", progress=False).ok
    assert len(packer.open_dataset(tmp_path / "out.h5")) == len(tree.good) - 1


def test_a_name_too_long_for_the_output_is_skipped(tree: DemoTree, tmp_path: Path) -> None:
    """Two 253-byte names differing only by extension keep it in their keys: key + '.bmp' is
    257 bytes, over the 255 a file name may have, so BMP skips them with a reason."""
    src = Path(shutil.copytree(tree.root, tmp_path / "src"))
    stem = "y" * 249
    for ext in (".jpg", ".png"):
        shutil.copy(tree.good[0], src / "class_00" / (stem + ext))
    result = packer.convert(src, tmp_path / "out.bmp", progress=False)
    reasons = {Path(s.path).name: s.reason for s in result.skipped}
    assert (
        reasons[stem + ".jpg"]
        == reasons[stem + ".png"]
        == ("name too long for the output file system")
    )
    assert len(packer.open_dataset(tmp_path / "out.bmp")) == len(tree.good)
    lmdb = packer.convert(src, tmp_path / "out.lmdb", progress=False)  # shards: names unused
    assert len(packer.open_dataset(tmp_path / "out.lmdb")) == len(tree.good) + 2
    assert not any("too long" in s.reason for s in lmdb.skipped)


def test_read_input_reads_whole_files_and_refuses_what_it_must_not_read(tmp_path: Path) -> None:
    """A source file is read whole, whatever its size up to the limit (a file larger than one
    read returns, a file of exactly the limit, an empty one); over the limit, a FIFO, a folder
    or a missing file is an InputFileError with its reason, never a hang or a short read."""
    import threading

    from packer.write.loading import read_input

    rng = np.random.default_rng(0)
    for size in (0, 1, 4095, 4096, 70_000, 3_000_001):
        path = tmp_path / f"f{size}"
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        path.write_bytes(data)
        assert read_input(str(path), max_bytes=3_000_001) == data, size
    with pytest.raises(InputFileError, match="over the 3 MB limit"):
        read_input(str(tmp_path / "f3000001"), max_bytes=3_000_000)
    os.mkfifo(tmp_path / "fifo")
    writer = threading.Timer(5.0, lambda: open(tmp_path / "fifo", "wb").close())  # unblock a hang
    writer.start()
    try:
        with pytest.raises(InputFileError, match="not a regular file"):
            read_input(str(tmp_path / "fifo"))
    finally:
        writer.cancel()
    with pytest.raises(InputFileError, match="not a regular file"):
        read_input(str(tmp_path))  # a folder
    for missing in (tmp_path / "missing", tmp_path / "nope" / "x"):
        with pytest.raises(InputFileError, match="cannot read"):
            read_input(str(missing))
