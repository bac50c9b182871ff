from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer import __version__
from packer.cli.app import main
from packer.demo.image import DemoTree


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.mark.parametrize("command", [[], ["convert"], ["inspect"], ["demo"], ["verify"]])
def test_help_everywhere(command: list[str]) -> None:
    code, out = run(*command, "--help")
    assert code == 0 and "Usage:" in out
    if command:
        assert "Example:" in out


def test_version() -> None:
    assert run("--version") == (0, f"packer, version {__version__}\n")


def test_convert_then_inspect(tree: DemoTree, tmp_path: Path, suffix: str) -> None:
    dst = tmp_path / f"out{suffix}"
    code, out = run("convert", tree.root, dst, "--workers", "2", "--shard-size", "30kB", "-q")
    assert code == 0, out
    assert f"{len(tree.good)} samples, 3 classes" in out
    assert "skipped 1 input(s)" in out and "broken_000.JPEG" in out
    code, out = run("inspect", dst, "--skipped")
    assert code == 0, out
    assert f"samples: {len(tree.good)}" in out
    assert "class_00 (4), class_01 (4), class_02 (4)" in out
    assert "truncated JPEG" in out


@pytest.mark.parametrize(
    "make, dst_name, message",
    [
        ("missing", "o.lmdb", "does not exist"),
        ("file", "o.lmdb", "is a file"),
        ("no-classes", "o.lmdb", "no class folders"),
        ("no-images", "o.lmdb", "no images"),
        ("good", "o.zip", "unknown destination suffix '.zip'"),
        ("good", "exists.lmdb", "exists; pass --overwrite"),
        ("good", "nodir/sub/o.npy", "does not exist"),
    ],
)
def test_bad_input_is_one_clear_line(
    tree: DemoTree, tmp_path: Path, make: str, dst_name: str, message: str
) -> None:
    src = tmp_path / "src"
    if make == "file":
        src.write_bytes(b"x")
    elif make == "no-classes":
        src.mkdir()
    elif make == "no-images":
        (src / "a").mkdir(parents=True)
    elif make == "good":
        src = tree.root
    (tmp_path / "exists.lmdb").mkdir()
    code, out = run("convert", src, tmp_path / dst_name, "-q")
    assert code == 1
    assert out.startswith("Error: ") and message in out
    assert "Traceback" not in out
    assert not (tmp_path / dst_name).with_name(Path(dst_name).name + ".partial").exists()


def test_inspect_incomplete_output(tmp_path: Path) -> None:
    (tmp_path / "half.lmdb").mkdir()
    code, out = run("inspect", tmp_path / "half.lmdb")
    assert code == 1 and "not a complete packer dataset" in out


def test_python_dash_m(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "packer", "--help"], capture_output=True, text=True, check=True
    )
    assert "convert" in out.stdout


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    code, out = run("demo", tmp_path / "demo", "--classes", "2", "--per-class", "6", "-q")
    assert code == 0, out
    for name in ("jpeg folder", "lmdb", "h5", "npy", "bmp"):
        assert f"| {name} |" in out
    assert "truncated JPEG" in out


@pytest.mark.parametrize(
    "args",
    [
        ["convert", "src", "dst.lmdb", "--workers", "0"],
        ["convert", "src", "dst.lmdb", "--short-side", "0"],
        ["convert", "src", "dst.lmdb", "--max-pixels", "0"],
        ["verify", ".", "--workers", "0"],
        ["bench", ".", "--batch-size", "0"],
        ["bench", ".", "--limit", "0"],
        ["doctor", ".", "--batch-size", "0"],
    ],
)
def test_the_shared_positive_int_options_refuse_zero(args: list[str]) -> None:
    """The option kinds cliutil declares once (positive_int, batch_size_option) hold on every
    command that uses them: 0 is a usage error naming the option, before any work."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{args[-2]}': 0 is not in the range x>=1" in result.output
