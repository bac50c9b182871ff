"""README guarantees that once had no test able to fail: each test below was proved by a one-line
mutation of the product code (the test failed, the mutation was reverted).

- ``--max-pixels`` judged on a JPEG's header, with no decode (``--check fast``);
- a record overrunning its shard by a byte or a few is refused at open;
- a labels CSV loses its header row and nothing else;
- ``--part`` + ``merge`` lists the same skipped inputs as one run;
- every written file and its folder is fsync'd before the output is published (observed with
  strace, a real trace of the system calls).
"""

from __future__ import annotations

import io
import json
import re
import shutil
import struct
import subprocess
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import xxhash
from click.testing import CliRunner
from harness.damage import corrupted_scan
from PIL import Image

import packer
from packer.cli.app import main
from packer.decode.check import check_image
from packer.demo.image import DemoTree
from packer.errors import FormatError, InputFileError
from packer.source.labels import read_labels

STRACE_INSTALL = "apt-get install -y strace"


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def manifest_of(root: Path) -> dict:  # type: ignore[type-arg]
    return dict(json.loads((root / "packer.json").read_text()))


# --- --max-pixels on a JPEG's header ---------------------------------------------------------


def with_frame_size(data: bytes, width: int, height: int) -> bytes:
    """The JPEG ``data`` whose frame header (SOF0) declares ``width`` × ``height``; the scan is
    unchanged, so only a reader of the header sees the new size."""
    sof = data.index(b"\xff\xc0")
    head = struct.pack(">HH", height, width)
    return data[: sof + 5] + head + data[sof + 9 :]


@pytest.fixture
def one_class(tree: DemoTree, tmp_path: Path) -> Path:
    """One class folder: ``img0.jpg`` 64×48 (3,072 pixels, from the demo), ``img1.jpg`` 40×30."""
    folder = tmp_path / "src" / "cls"
    folder.mkdir(parents=True)
    first, second = sorted(tree.good)[:2]
    shutil.copy(first, folder / "img0.jpg")
    with Image.open(second) as image:
        image.resize((40, 30)).save(folder / "img1.jpg", quality=90)
    return folder.parent


@pytest.mark.parametrize("check", ["fast", "scan"])
def test_a_jpeg_over_max_pixels_is_skipped_from_its_header(
    one_class: Path, tmp_path: Path, check: str
) -> None:
    big = one_class / "cls" / "img0.jpg"
    big.write_bytes(with_frame_size(big.read_bytes(), 30_000, 30_000))  # 900 Mpx declared
    dst = tmp_path / f"out-{check}.lmdb"
    code, output = run_cli("convert", str(one_class), str(dst), "-q", "--check", check)
    assert code == 0, output
    reason = "30000×30000 is 900 Mpx, over the 90 Mpx limit (--max-pixels)"
    assert reason in output
    assert manifest_of(dst)["skipped"] == [{"path": str(big), "reason": reason}]
    assert list(packer.open_dataset(dst).keys) == ["cls/img1"]


@pytest.mark.parametrize("check", ["fast", "scan"])
def test_max_pixels_is_a_limit_on_the_jpeg_header(
    one_class: Path, tmp_path: Path, check: str
) -> None:
    """64×48 = 3,072 pixels: skipped over a limit of 3,071, kept at exactly 3,072."""
    over = tmp_path / f"over-{check}.npy"
    code, output = run_cli(
        "convert", str(one_class), str(over), "-q", "--check", check, "--max-pixels", "3071"
    )
    assert code == 0, output
    assert "img0.jpg: 64×48 is 3,072 px, over the 3,071 px limit (--max-pixels)" in output
    assert list(packer.open_dataset(over).keys) == ["cls/img1"]
    at = tmp_path / f"at-{check}.npy"
    code, output = run_cli(
        "convert", str(one_class), str(at), "-q", "--check", check, "--max-pixels", "3072"
    )
    assert code == 0, output
    assert "over the" not in output
    assert sorted(packer.open_dataset(at).keys) == ["cls/img0", "cls/img1"]


def png_declaring(width: int, height: int) -> bytes:
    """A PNG whose header declares ``width`` × ``height`` (its data is a few bytes: only the
    header is ever read by a size check)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = zlib.compress(b"\0" * 64)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data) + chunk(b"IEND", b"")
    )


EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n0 0 moveto\n%%EOF\n"
FORMATS = "JPEG, PNG, WEBP, BMP, GIF, TIFF, PPM"


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "empty file (0 bytes)"),
        (
            png_declaring(10_000, 10_000),
            "10000×10000 is 100 Mpx, over the 90 Mpx limit (--max-pixels)",
        ),
        (
            png_declaring(30_000, 30_000),
            "decompression bomb refused by Pillow: Image size (900000000",
        ),
        (EPS, f"not an image Pillow can identify (of {FORMATS})"),
    ],
    ids=["empty", "png-100Mpx", "png-900Mpx", "eps"],
)
@pytest.mark.parametrize("check", ["fast", "scan", "decode"])
def test_bounded_inputs_of_every_format(data: bytes, reason: str, check: str) -> None:
    with pytest.raises(InputFileError) as refused:
        check_image(data, check)
    assert str(refused.value).startswith(reason)


def test_a_png_within_the_limits_passes_every_check_without_a_warning(tree: DemoTree) -> None:
    out = io.BytesIO()
    with Image.open(sorted(tree.good)[0]) as image:
        image.save(out, format="PNG")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Pillow's bomb warning is silenced below the limit
        for check in ("fast", "scan", "decode"):
            check_image(out.getvalue(), check)
        check_image(png_declaring(10_000, 10_000), "fast", max_pixels=100_000_000)


def test_check_decode_and_scan_walk_the_scan(tree: DemoTree) -> None:
    damaged = corrupted_scan(sorted(tree.good)[0].read_bytes())
    check_image(damaged, "fast")  # the header and end marker are intact
    for check in ("scan", "decode"):
        with pytest.raises(InputFileError, match="broken image"):
            check_image(damaged, check)


def test_a_jpeg_packer_cannot_walk_is_still_checked_as_a_jpeg(tree: DemoTree) -> None:
    """Junk bytes between two segments: packer's marker walk gives up, Pillow reads it as a
    JPEG — and it is still held to the JPEG rules (end marker, --max-pixels)."""
    data = sorted(tree.good)[0].read_bytes()
    (app0,) = struct.unpack(">H", data[4:6])
    junk = data[: 4 + app0] + b"\0\0" + data[4 + app0 :]
    check_image(junk, "fast")
    with pytest.raises(InputFileError, match="truncated JPEG"):
        check_image(junk[: len(junk) // 2], "fast")
    with pytest.raises(InputFileError, match="10000×10000 is 100 Mpx, over the 90 Mpx limit"):
        check_image(with_frame_size(junk, 10_000, 10_000), "fast")


# --- a record overrunning its shard by a few bytes -------------------------------------------


def craft_records(root: Path, change) -> None:  # type: ignore[no-untyped-def]
    """Rewrite ``records.npy`` through ``change(records, shard_sizes)`` and record its new
    checksum in the manifest, as a careful forger would: only the bounds check is left to
    catch it."""
    manifest = manifest_of(root)
    records = np.load(root / "records.npy")
    change(records, [s["bytes"] for s in manifest["shards"]])
    np.save(root / "records.npy", records)
    manifest["files"]["records.npy"] = checksum(root / "records.npy")
    (root / "packer.json").write_text(json.dumps(manifest))


def checksum(path: Path) -> str:
    """The xxh3-64 a manifest records for a table (re-sealing a crafted one)."""
    return xxhash.xxh3_64(path.read_bytes()).hexdigest()


def setting(column: str, where, value: int):  # type: ignore[no-untyped-def]
    """A change for :func:`craft_records`: ``records[column][where] = value``."""

    def change(records: np.ndarray, sizes: list[int]) -> None:
        records[column][where(records) if callable(where) else where] = value

    return change


def last_of_shard(records: np.ndarray, shard: int) -> int:
    """The row of the record of ``shard`` that ends furthest into its file."""
    rows = np.flatnonzero(records["file"] == shard)
    ends = records["offset"][rows].astype(np.int64) + records["length"][rows]
    return int(rows[np.argmax(ends)])


@pytest.mark.parametrize("column", ["length", "offset"])
@pytest.mark.parametrize("over", [0, 1, 3])
@pytest.mark.parametrize("suffix", [".npy", ".h5", ".lmdb"])
def test_a_record_overrunning_its_shard_by_a_few_bytes(
    packed: dict[str, Path], tmp_path: Path, suffix: str, over: int, column: str
) -> None:
    root = Path(shutil.copytree(packed[suffix], tmp_path / f"x{suffix}"))
    shard = len(manifest_of(root)["shards"]) - 1

    def overrun(records: np.ndarray, sizes: list[int]) -> None:
        row = last_of_shard(records, shard)
        offset, length = int(records["offset"][row]), int(records["length"][row])
        if column == "length":
            records["length"][row] = sizes[shard] - offset + over
        else:
            records["offset"][row] = sizes[shard] - length + over
        assert int(records["offset"][row]) + int(records["length"][row]) == sizes[shard] + over

    craft_records(root, overrun)
    if over == 0:  # ending exactly at the end of its file is inside it
        assert len(packer.open_dataset(root, output="bytes")) == len(
            packer.open_dataset(packed[suffix])
        )
        return
    with pytest.raises(FormatError, match="outside"):
        packer.open_dataset(root, output="bytes")


def test_an_lmdb_offset_may_be_unknown_and_no_other(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    """LMDB records ``-1`` where a value's offset could not be told (no ``/proc``): the dataset
    opens and reads as before. In NPY and HDF5 shards a ``-1`` offset is outside the file."""
    lmdb = Path(shutil.copytree(packed[".lmdb"], tmp_path / "x.lmdb"))
    craft_records(lmdb, setting("offset", slice(None), -1))
    before, after = (
        packer.open_dataset(packed[".lmdb"], output="bytes"),
        packer.open_dataset(lmdb, output="bytes"),
    )
    assert [after[i][0] for i in range(len(after))] == [before[i][0] for i in range(len(before))]
    for suffix in (".npy", ".h5"):
        root = Path(shutil.copytree(packed[suffix], tmp_path / f"x{suffix}"))
        craft_records(root, setting("offset", 4, -1))
        with pytest.raises(FormatError, match="outside"):
            packer.open_dataset(root)


@pytest.mark.parametrize("suffix", [".npy", ".lmdb"])
def test_a_record_naming_a_shard_the_dataset_lacks(
    packed: dict[str, Path], tmp_path: Path, suffix: str
) -> None:
    source = packed[suffix]
    shards = len(manifest_of(source)["shards"])
    assert shards >= 2
    for n, file in enumerate((shards, -1)):
        root = Path(shutil.copytree(source, tmp_path / f"{n}{suffix}"))
        craft_records(root, setting("file", 5, file))
        with pytest.raises(FormatError) as refused:
            packer.open_dataset(root)
        message = str(refused.value)
        assert str(root) in message and "names a file" in message and "row 5" in message
        assert message.endswith("Convert the source again")


def test_a_shard_left_without_records(tree: DemoTree, tmp_path: Path) -> None:
    """The records of the last of three shards moved to the first: the counts disagree."""
    root = tmp_path / "three.npy"
    packer.convert(tree.root, root, shard_size="8kB", progress=False)
    shards = len(manifest_of(root)["shards"])
    assert shards >= 3
    craft_records(root, setting("file", lambda records: records["file"] == shards - 1, 0))
    with pytest.raises(FormatError):
        packer.open_dataset(root)


def edit(root: Path, change) -> Path:  # type: ignore[no-untyped-def]
    manifest = manifest_of(root)
    change(manifest)
    (root / "packer.json").write_text(json.dumps(manifest))
    return root


def test_table_refusals_name_the_dataset_and_the_fix(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    def copy(suffix: str, name: str) -> Path:
        return Path(shutil.copytree(packed[suffix], tmp_path / f"{name}{suffix}"))

    def refusal(root: Path, *opening) -> str:  # type: ignore[no-untyped-def]
        with pytest.raises(FormatError) as refused:
            (opening[0] if opening else packer.open_dataset)(root)
        assert str(root) in str(refused.value)
        return str(refused.value)

    unknown = edit(copy(".npy", "zip"), lambda m: m["options"].update(layout="zip"))
    assert "options.layout is 'zip'; expected one of 'shards', 'per-sample'" in refusal(unknown)
    label = copy(".npy", "label")
    index = np.load(label / "index.npy")
    index["label"][3] = 3
    np.save(label / "index.npy", index)
    edit(label, lambda m: m["files"].update({"index.npy": checksum(label / "index.npy")}))
    assert refusal(label).endswith(
        "label outside the 3 classes (row 3); refusing to read it. Convert the source again"
    )
    counts = edit(
        copy(".npy", "counts"),
        lambda m: m["shards"][0].update(samples=m["shards"][0]["samples"] + 1),
    )
    assert refusal(counts).endswith(
        "record counts disagree; refusing to read it. Convert the source again"
    )
    name = edit(copy(".npy", "name"), lambda m: m["shards"][0].update(name="../shard-00000.npy"))
    assert refusal(name).endswith(
        "is not a plain shard file name in the dataset folder; refusing to read outside it"
    )
    assert refusal(packed[".npy"], packer.LMDBDataset).endswith(
        "holds format 'npy', not 'lmdb'; use packer.open_dataset() to pick the right class"
    )
    assert refusal(packed[".npy"], packer.NPYVideoDataset).endswith("holds images, not videos")


def test_the_bounds_of_a_record(packed: dict[str, Path], tmp_path: Path) -> None:
    """A byte offset of 0 is inside a shard; a per-sample file's record number must be below
    the sample's count of records (1 for an image)."""
    root = Path(shutil.copytree(packed[".npy"], tmp_path / "zero.npy"))
    craft_records(root, setting("offset", 2, 0))
    assert len(packer.open_dataset(root)) == len(packer.open_dataset(packed[".npy"]))
    for number, name in ((1, "one"), (-1, "minus")):
        root = Path(shutil.copytree(packed[".bmp"], tmp_path / f"{name}.bmp"))
        craft_records(root, setting("offset", 4, number))
        with pytest.raises(FormatError, match=r"record lies outside its file \(row 4\)") as refused:
            packer.open_dataset(root)
        assert str(root) in str(refused.value)


# --- the header row of a labels CSV ----------------------------------------------------------


@pytest.fixture
def flat(tree: DemoTree, tmp_path: Path) -> Path:
    folder = tmp_path / "flat"
    folder.mkdir()
    for n, path in enumerate(sorted(tree.good)[:4]):
        shutil.copy(path, folder / f"img{n}.jpg")
    return folder


LABELS = {"img0": "cat", "img1": "dog", "img2": "cat", "img3": "bird"}


def test_a_labels_csv_loses_its_header_and_keeps_its_first_row(flat: Path, tmp_path: Path) -> None:
    csv = tmp_path / "labels.csv"
    rows = [f"{name}.jpg,{label} 1 2 3 4" for name, label in LABELS.items()]
    csv.write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
    assert read_labels(csv) == LABELS
    dst = tmp_path / "val.lmdb"
    code, output = run_cli("convert", str(flat), str(dst), "-q", "--labels", str(csv))
    assert code == 0, output
    assert "ImageId" not in output and "skipped" not in output
    ds = packer.open_dataset(dst)
    assert ds.classes == ["bird", "cat", "dog"]  # not "PredictionString"
    assert {k: ds.classes[t] for k, t in zip(ds.keys, ds.targets.tolist())} == LABELS
    assert manifest_of(dst)["skipped"] == []


def test_name_label_lines_keep_their_first_line(flat: Path, tmp_path: Path) -> None:
    lines = tmp_path / "labels.txt"
    lines.write_text("".join(f"{name} {label}\n" for name, label in LABELS.items()))
    assert read_labels(lines) == LABELS
    dst = tmp_path / "val.npy"
    packer.convert(flat, dst, labels=lines, progress=False)
    ds = packer.open_dataset(dst)
    assert {k: ds.classes[t] for k, t in zip(ds.keys, ds.targets.tolist())} == LABELS


@pytest.mark.parametrize(
    "text, line",
    [
        ("ImageId,PredictionString\nimg0,cat\nimg1,\n", 3),  # the CSV's lines count the header
        ("img0 cat\nimg1\n", 2),
    ],
)
def test_a_row_without_a_label_is_named_by_its_line(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "labels"
    path.write_text(text)
    with pytest.raises(packer.PackerError, match=f"line {line}: expected a name and a label"):
        read_labels(path)


# --- merge lists what one run skips ----------------------------------------------------------


def test_parts_and_merge_list_the_skipped_inputs_of_one_run(tree: DemoTree, tmp_path: Path) -> None:
    src = Path(shutil.copytree(tree.root, tmp_path / "src", symlinks=True))
    (src / "class_01" / "dangling.jpg").symlink_to(tmp_path / "nowhere.jpg")
    options = ["--shard-size", "20kB", "-q"]
    one = tmp_path / "one.lmdb"
    code, output = run_cli("convert", str(src), str(one), *options)
    assert code == 0, output
    skipped = manifest_of(one)["skipped"]
    reasons = {Path(s["path"]).name for s in skipped}
    assert "dangling.jpg" in reasons and len(skipped) == 2, skipped  # and the truncated JPEG
    merged = tmp_path / "merged.lmdb"
    for part in ("0/2", "1/2"):
        code, output = run_cli("convert", str(src), str(merged), *options, "--part", part)
        assert code == 0, output
    code, output = run_cli("merge", str(merged))
    assert code == 0, output
    assert manifest_of(merged)["skipped"] == skipped
    assert "dangling.jpg" in output


# --- fsync before publishing, observed with strace --------------------------------------------

SYNC = re.compile(r"^(\d+) +f(?:data)?sync\(\d+<(.*)>\) += 0$")
RENAME = re.compile(
    r'^(\d+) +rename(?:at2?)?\((?:AT_FDCWD, )?"(.*)", (?:AT_FDCWD, )?"(.*?)"(?:, \w+)?\) += 0$'
)
MKDIR = re.compile(r'^(\d+) +mkdir(?:at)?\((?:AT_FDCWD, )?"(.*)", \S+\) += 0$')


def joined_lines(log: str) -> list[str]:
    """strace -f lines with each ``<unfinished ...>`` call joined to its ``resumed`` end."""
    pending: dict[str, str] = {}
    out = []
    for line in log.splitlines():
        pid = line.split(" ", 1)[0]
        if line.endswith("<unfinished ...>"):
            pending[pid] = line[: -len("<unfinished ...>")].rstrip()
        elif " resumed>" in line:
            out.append(pending.pop(pid, "") + line.split(" resumed>", 1)[1])
        else:
            out.append(line)
    return out


def traced_convert(src: Path, dst: Path, *options: str) -> list[tuple[str, Path, Path | None]]:
    """Run ``packer convert`` under strace; its fsyncs, renames and mkdirs in order, as
    (call, path, new path) with absolute paths."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.fail(f"strace is needed to observe fsync: install it ({STRACE_INSTALL})")
    log = dst.parent / "strace.log"
    command = [strace, "-f", "--seccomp-bpf", "-qq", "-y", "-o", str(log)]  # only those calls stop
    command += ["-e", "trace=fsync,fdatasync,rename,renameat,renameat2,mkdir,mkdirat"]
    command += [sys.executable, "-m", "packer", "convert", str(src), str(dst), "-q", *options]
    elsewhere = dst.parent / "cwd"  # not DST's folder: an fsync of "." is not one of it
    elsewhere.mkdir()
    run = subprocess.run(command, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr + run.stdout
    events: list[tuple[str, Path, Path | None]] = []
    here = elsewhere
    for line in joined_lines(log.read_text()):
        if match := SYNC.match(line):
            events.append(("fsync", Path(match[2]), None))
        elif match := RENAME.match(line):
            events.append(("rename", here / match[2], here / match[3]))
        elif match := MKDIR.match(line):
            events.append(("mkdir", here / match[2], None))
    return events


def unsynced(events: list[tuple[str, Path, Path | None]], dst: Path) -> list[str]:
    """What of ``dst`` was not durable when it was published: a file not fsync'd under its final
    name, a name (file or folder) whose folder was not fsync'd after it appeared."""
    partial = dst.with_name(dst.name + ".partial")
    publish = [i for i, e in enumerate(events) if e[0] == "rename" and e[1:] == (partial, dst)]
    if len(publish) != 1:
        return [f"no single rename of {partial} to {dst}"]
    end = publish[0]

    def final(path: Path) -> Path:  # where a path of the partial output is once published
        return dst / path.relative_to(partial) if path.is_relative_to(partial) else path

    synced_files: set[Path] = set()
    named_at: dict[Path, int] = {}  # when each name appeared (mkdir, rename, fsync of a new file)
    dir_syncs: dict[Path, list[int]] = {}
    for i, (call, path, new) in enumerate(events[:end]):
        if call == "mkdir":
            named_at[path] = i
        elif call == "rename" and new is not None:
            if path in synced_files:
                synced_files.discard(path)
                synced_files.add(new)
            named_at[new] = i
        elif call == "fsync" and final(path).is_dir():
            dir_syncs.setdefault(path, []).append(i)
        elif call == "fsync":
            synced_files.add(path)
            named_at.setdefault(path, i)
    problems = []
    for path in sorted(dst.rglob("*")):
        inside = partial / path.relative_to(dst)
        if path.is_file() and inside not in synced_files:
            problems.append(f"{inside} not fsync'd")
        since = named_at.get(inside, -1)
        if not any(since < i for i in dir_syncs.get(inside.parent, [])):
            problems.append(f"{inside.parent} not fsync'd after {inside.name} appeared in it")
    after = [e for e in events[end:] if e[0] == "fsync" and e[1] == dst.parent]
    if not after:
        problems.append(f"{dst.parent} not fsync'd after the final rename")
    return problems


@pytest.mark.parametrize("suffix", [".lmdb", ".npy", ".h5", ".bmp"])
def test_every_file_and_folder_is_fsyncd_before_publishing(
    tree: DemoTree, tmp_path: Path, suffix: str
) -> None:
    dst = tmp_path / f"out{suffix}"
    events = traced_convert(tree.root, dst, "--shard-size", "20kB")
    assert len(packer.open_dataset(dst)) == len(tree.good)
    assert any(e[0] == "fsync" for e in events), "strace saw no fsync at all"
    assert unsynced(events, dst) == []


# --- refusals of a destination name both places (mutation testing found their paths unguarded) --


def test_destination_refusals_name_the_paths(tree: DemoTree, tmp_path: Path) -> None:
    src = Path(shutil.copytree(tree.root, tmp_path / "src"))
    stranger = tmp_path / "mine.lmdb"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("someone else's")  # an empty folder may be replaced
    (tmp_path / "file.npy").write_bytes(b"not a folder")
    cases = [
        (src / "inside.lmdb", False, [src / "inside.lmdb", src]),
        (tmp_path / "src.lmdb", False, []),  # fine: beside the source
        (stranger, True, [stranger]),
        (tmp_path / "file.npy", True, [tmp_path / "file.npy"]),
    ]
    for dst, overwrite, named in cases:
        if not named:
            packer.convert(src, dst, progress=False)
            with pytest.raises(packer.DestinationError) as refused:
                packer.convert(src, dst, progress=False)
            assert str(dst) in str(refused.value) and "--overwrite" in str(refused.value)
            continue
        with pytest.raises(packer.DestinationError) as refused:
            packer.convert(src, dst, overwrite=overwrite, progress=False)
        assert all(repr(str(p)) in str(refused.value) for p in named), refused.value
    partial = tmp_path / "cut.npy.partial"
    (partial / "_progress").mkdir(parents=True)
    (partial / "shard-00000.npy").write_bytes(b"work of a killed run")
    with pytest.raises(packer.DestinationError) as refused:
        packer.convert(src, tmp_path / "cut.npy", progress=False)
    assert str(partial) in str(refused.value) and "--resume" in str(refused.value)
    empty = tmp_path / "empty.npy.partial"  # killed before its first checkpoint: started afresh
    empty.mkdir()
    packer.convert(src, tmp_path / "empty.npy", progress=False)
    assert not empty.exists() and (tmp_path / "empty.npy" / "packer.json").is_file()


def test_a_csv_without_header_keeps_its_first_row(tmp_path: Path) -> None:
    """A headerless CSV whose rows name image files loses no row; a header row is still skipped."""
    from packer.source.labels import read_labels

    bare = tmp_path / "bare.csv"
    bare.write_text("img_00000.JPEG,cat\nimg_00001.JPEG,dog\n")
    assert read_labels(bare) == {"img_00000": "cat", "img_00001": "dog"}
    headed = tmp_path / "headed.csv"
    headed.write_text("filename,label\nimg_00000.JPEG,cat\n")
    assert read_labels(headed) == {"img_00000": "cat"}
