"""``check=`` of ``packer.Writer``, ``packer.pack`` and ``packer pack --check``: convert's levels
with convert's meaning. The default (``scan``) refuses at ``write()`` what a reader would fail
on, naming the key and the field; ``fast`` catches truncated files and non-images but stores a
JPEG whose Huffman table or scan data is corrupt; a bad level is refused by name."""

from __future__ import annotations

import inspect
import io
import os
import sys
from pathlib import Path
from typing import Any, get_args

import numpy as np
import pytest
from click.testing import CliRunner
from harness.damage import corrupted_scan
from PIL import Image

import packer
from packer.cli.app import main
from packer.cli.pack import CHECK_CHOICES
from packer.decode.check import CHECKS, DEFAULT_CHECK
from packer.demo.image import photo_like
from packer.upload.url_writer import Writer as UrlWriter
from packer.write.writer import Writer as LocalWriter
from packer.write.writer_values import Check, WriterOptions


def photo(seed: int = 0) -> bytes:
    out = io.BytesIO()
    photo_like(np.random.default_rng(seed), 96, 64).save(out, format="JPEG", quality=90)
    return out.getvalue()


def bad_huffman_table(data: bytes) -> bytes:
    """``data`` with its first Huffman table's code counts overflowing (the table follows the
    frame header, which is as far as the fast check reads)."""
    at = data.index(b"\xff\xc4")
    assert at > data.index(b"\xff\xc0"), "the table after the frame header"
    return data[: at + 5] + b"\xff" * 16 + data[at + 21 :]


GOOD = photo()
DAMAGED = {  # name: (bytes, caught by fast, caught by scan)
    "truncated": (GOOD[: len(GOOD) // 2], True, True),
    "not an image": (b"<html>404 Not Found</html>", True, True),
    "corrupt huffman table": (bad_huffman_table(GOOD), False, True),
    "corrupt scan data": (corrupted_scan(GOOD), False, True),
}


def reader_fails(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except (OSError, ValueError, SyntaxError):
        return True
    return False


def test_every_damaged_jpeg_here_fails_a_reader() -> None:
    """What the cases stand for: bytes that would fail a DataLoader worker at training."""
    assert not reader_fails(GOOD)
    assert all(reader_fails(data) for data, _, _ in DAMAGED.values())


@pytest.mark.parametrize("check", ["scan", "fast"])
@pytest.mark.parametrize("case", sorted(DAMAGED))
def test_what_each_check_catches_at_write(tmp_path: Path, check: str, case: str) -> None:
    data, by_fast, by_scan = DAMAGED[case]
    caught = by_scan if check == "scan" else by_fast
    out = tmp_path / "out.lmdb"
    options: dict[str, Any] = {} if check == DEFAULT_CHECK else {"check": check}
    with packer.Writer(out, **options) as writer:
        writer.write({"__key__": "good", "jpg": GOOD, "txt": "fine"})
        if caught:
            with pytest.raises(packer.PackerError, match=r"sample 'bad', field 'jpg' \(image\)"):
                writer.write({"__key__": "bad", "jpg": data, "txt": "broken"})
        else:
            writer.write({"__key__": "bad", "jpg": data, "txt": "broken"})
    dataset = packer.open_dataset(out, output="bytes")
    assert [dataset[i]["__key__"] for i in range(len(dataset))] == (
        ["good"] if caught else ["good", "bad"]
    )
    if not caught:  # fast stored it unchanged: a reader meets it later
        assert dataset[1]["jpg"] == data
    assert dataset.manifest.options["check"] == check


def test_the_default_is_converts_default_scan() -> None:
    assert DEFAULT_CHECK == "scan"
    for function in (LocalWriter.__init__, packer.pack):
        assert inspect.signature(function).parameters["check"].default == DEFAULT_CHECK
    assert set(get_args(Check)) == set(CHECKS) == set(CHECK_CHOICES)
    assert CHECK_CHOICES[0] == DEFAULT_CHECK  # the CLI's default


def test_pixels_are_encoded_whatever_the_check(tmp_path: Path) -> None:
    pixels = np.asarray(Image.open(io.BytesIO(GOOD)))
    with packer.Writer(tmp_path / "p.npy", check="decode") as writer:
        writer.write({"__key__": "a", "png": pixels})
    assert (packer.open_dataset(tmp_path / "p.npy", output="numpy")[0]["png"] == pixels).all()


@pytest.mark.parametrize("bad", ["quick", "SCAN", "", None, 1])
def test_a_bad_check_is_refused_by_name_before_anything_is_written(
    tmp_path: Path, bad: Any
) -> None:
    expected = rf"invalid check {bad!r}; expected one of fast, scan, decode"
    with pytest.raises(packer.PackerError, match=expected.replace("(", r"\(")):
        packer.Writer(tmp_path / "w.lmdb", check=bad)
    with pytest.raises(packer.PackerError, match=expected.replace("(", r"\(")):
        packer.pack(range(3), tmp_path / "p.lmdb", sample_of, check=bad, progress=False)
    assert not list(tmp_path.iterdir())


def sample_of(i: int) -> dict[str, Any]:
    return {"jpg": GOOD if i != 2 else corrupted_scan(GOOD), "cls": i}


def dies_at_30(i: int) -> dict[str, Any]:
    if i == 30:
        os._exit(3)
    return {"jpg": GOOD, "cls": i}


@pytest.mark.parametrize("workers", [1, 2])
def test_pack_checks_in_its_workers_and_lists_what_fails(tmp_path: Path, workers: int) -> None:
    scanned = packer.pack(range(4), tmp_path / "s.lmdb", sample_of, workers=workers,
                          progress=False)  # fmt: skip
    assert len(scanned.skipped) == 1 and "2" in scanned.skipped[0].path
    assert "field 'jpg' (image)" in scanned.skipped[0].reason
    assert len(packer.open_dataset(tmp_path / "s.lmdb")) == 3
    fast = packer.pack(range(4), tmp_path / "f.lmdb", sample_of, workers=workers, check="fast",
                       progress=False)  # fmt: skip
    assert fast.skipped == [] and len(packer.open_dataset(tmp_path / "f.lmdb")) == 4
    assert fast.manifest.options["check"] == "fast"
    assert scanned.manifest.options["check"] == "scan"


def test_pack_resume_refuses_another_check(tmp_path: Path) -> None:
    out = tmp_path / "o.lmdb"
    with pytest.raises(packer.PackerError, match="resume=True"):
        packer.pack(range(40), out, dies_at_30, workers=2, shard_size="20kB", progress=False)
    with pytest.raises(packer.PackerError, match="cannot resume.*option check"):
        packer.pack(range(40), out, dies_at_30, check="fast", resume=True, progress=False)
    assert (tmp_path / "o.lmdb.partial").is_dir()


PREP = """
import sys
sys.path.insert(0, BENCHMARKS)
from harness.damage import corrupted_scan
GOOD = open(PATH, "rb").read()

def to_sample(line):
    return {"__key__": line, "jpg": corrupted_scan(GOOD) if line == "b" else GOOD}
"""


def test_the_cli_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "good.jpg").write_bytes(GOOD)
    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    prep = PREP.replace("BENCHMARKS", repr(benchmarks)).replace(
        "PATH", repr(str(tmp_path / "good.jpg"))
    )
    (tmp_path / "prep_check.py").write_text(prep)
    (tmp_path / "inputs.txt").write_text("a\nb\nc\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "prep_check", raising=False)
    base = ["pack", "prep_check:to_sample", "inputs.txt"]
    done = CliRunner().invoke(main, [*base, "scanned.lmdb", "-w", "1", "-q"])
    assert done.exit_code == 0, done.output
    assert len(packer.open_dataset(tmp_path / "scanned.lmdb")) == 2  # b skipped
    done = CliRunner().invoke(main, [*base, "fast.lmdb", "-w", "1", "-q", "--check", "fast"])
    assert done.exit_code == 0, done.output
    fast = packer.open_dataset(tmp_path / "fast.lmdb")
    assert len(fast) == 3 and fast.manifest.options["check"] == "fast"
    done = CliRunner().invoke(main, [*base, "bad.lmdb", "--check", "quick"])
    assert done.exit_code == 2 and "'quick' is not one of 'scan', 'fast', 'decode'" in done.output
    assert not (tmp_path / "bad.lmdb").exists() and not (tmp_path / "bad.lmdb.partial").exists()


def test_the_url_writer_takes_the_writers_keywords_as_one_typed_object() -> None:
    local = inspect.signature(LocalWriter.__init__).parameters
    keywords = {n for n, p in local.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords == set(WriterOptions.__annotations__)
    url = inspect.signature(UrlWriter.__init__).parameters
    assert [p.kind for p in url.values()][-1] is inspect.Parameter.VAR_KEYWORD
    assert set(url) == {"self", "dst", "staging", "options"}


def test_staging_is_refused_for_a_local_path(tmp_path: Path) -> None:
    with pytest.raises(packer.PackerError, match="staging= applies to a URL"):
        packer.Writer(tmp_path / "w.lmdb", staging=tmp_path / "staging")
    assert not (tmp_path / "w.lmdb.partial").exists()
