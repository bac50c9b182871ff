"""``packer pack MODULE:FUNCTION INPUTS DST``: inputs from a text file or a folder, the function
from a module or a file, errors as one line, a killed run resumed from the shell."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main

ROOT = str(Path(__file__).resolve().parents[1])

PREP = """
import os, signal
import numpy as np

def to_sample(path):
    if os.path.basename(path) == os.environ.get("KILL_ON", "-"):
        os.kill(os.getpid(), signal.SIGKILL)
    data = open(path, "rb").read()
    if not data:
        raise ValueError("empty file")
    return {"npy": np.frombuffer(data, np.uint8).astype(np.float32), "txt": os.path.basename(path)}

def pair(line):
    return (line.upper(), len(line))
"""


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``prep_mod`` in the current folder and a folder of 12 input files (one empty,
    one whose name is not UTF-8)."""
    (tmp_path / "prep_mod.py").write_text(PREP)
    folder = tmp_path / "inputs"
    (folder / "sub").mkdir(parents=True)
    for i in range(10):
        (folder / "sub" / f"f{i:02d}").write_bytes(bytes(range(i + 1)) * 40)
    (folder / "empty").write_bytes(b"")
    (folder / os.fsdecode(b"caf\xe9")).write_bytes(b"latin-1 name")
    (folder / ".hidden").write_bytes(b"never read")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "prep_mod", raising=False)
    return folder


def invoke(*args: str) -> Any:
    return CliRunner().invoke(main, ["pack", *args, "-q"])


def test_a_folder_of_inputs_packs_every_file_in_path_order(job: Path, tmp_path: Path) -> None:
    done = invoke("prep_mod:to_sample", str(job), str(tmp_path / "out.lmdb"), "-w", "2")
    assert done.exit_code == 0, done.output
    assert "skipped 2 input(s)" in done.output and "empty: ValueError: empty file" in done.output
    # the name that is not UTF-8 was read, but as a caption it cannot be text: listed, not lost
    assert "field 'txt' (text): not encodable as UTF-8" in done.output
    ds = packer.open_dataset(tmp_path / "out.lmdb")
    names = [ds[i]["txt"] for i in range(len(ds))]
    assert names == [f"f{i:02d}" for i in range(10)]
    assert list(ds[1]["npy"][:3]) == [0.0, 1.0, 0.0] and len(ds[1]["npy"]) == 80


def test_a_text_file_of_inputs_and_a_function_in_a_file(job: Path, tmp_path: Path) -> None:
    listing = tmp_path / "lines.txt"
    listing.write_text("alpha\n\nbeta\r\ngamma\n", encoding="utf-8")
    out = tmp_path / "pairs.npy"
    done = invoke(f"{tmp_path / 'prep_mod.py'}:pair", str(listing), str(out), "--fields", "txt,cls")
    assert done.exit_code == 0, done.output
    ds = packer.open_dataset(out)
    assert [(ds[i]["txt"], ds[i]["cls"]) for i in range(3)] == [
        ("ALPHA", 5),
        ("BETA", 4),
        ("GAMMA", 5),
    ]


def test_json_summary(job: Path, tmp_path: Path) -> None:
    done = invoke("prep_mod:to_sample", str(job), str(tmp_path / "o.lmdb"), "--json", "-w", "1")
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output)
    assert summary["ok"] and summary["samples"] == 10 and summary["kind"] == "fields"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("prep_mod", "expected MODULE:FUNCTION"),
        ("no_such_module_x:fn", "does not import: ModuleNotFoundError"),
        ("prep_mod:nothing", "has no 'nothing'"),
        ("prep_mod:np", "not a function"),
        ("missing.py:fn", "no such Python file"),
    ],
)
def test_a_function_that_cannot_be_found_is_one_line(
    job: Path, tmp_path: Path, spec: str, message: str
) -> None:
    done = invoke(spec, str(job), str(tmp_path / "o.lmdb"))
    assert done.exit_code == 1 and message in done.output, done.output
    assert "Traceback" not in done.output
    assert not (tmp_path / "o.lmdb").exists()


def test_bad_input_lists_are_one_line(job: Path, tmp_path: Path) -> None:
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n")
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9\n")
    for listing, message in ((blank, "holds no input"), (latin, "not UTF-8")):
        done = invoke("prep_mod:to_sample", str(listing), str(tmp_path / "o.lmdb"))
        assert done.exit_code == 1 and message in done.output, done.output


def test_killed_from_the_shell_and_resumed_gives_the_bytes_of_one_run(
    job: Path, tmp_path: Path, tree_files: Any
) -> None:
    reference = tmp_path / "ref.lmdb"
    assert (
        invoke("prep_mod:to_sample", str(job), str(reference), "--shard-size", "200B").exit_code
        == 0
    )
    out = tmp_path / "out.lmdb"
    cmd = [sys.executable, "-m", "packer", "pack", "prep_mod:to_sample", str(job), str(out)]
    cmd += ["--shard-size", "200B", "-q", "-w", "1"]
    env = {"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin", "KILL_ON": "f06"}
    killed = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, timeout=300)
    assert killed.returncode == -9
    refused = invoke("prep_mod:to_sample", str(job), str(out), "--shard-size", "200B")
    assert refused.exit_code == 1 and "--resume" in refused.output
    resumed = invoke("prep_mod:to_sample", str(job), str(out), "--shard-size", "200B", "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert "resumed at input" in resumed.output
    assert tree_files(out) == tree_files(reference)
