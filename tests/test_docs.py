"""The reference docs build from the code with no warning (Sphinx ``-W``: a broken link, a
docstring Sphinx cannot parse, a command whose ``--help`` fails), and the README stays short."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_docs_build_with_warnings_as_errors(tmp_path: Path) -> None:
    out = tmp_path / "html"
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    run = subprocess.run([*command, str(ROOT / "docs"), str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    api = (out / "api.html").read_text()
    for name in ("open_dataset", "ShardedSampler", "ReadOptions", "convert_to_url", "PackerError"):
        assert name in api, name
    cli = (out / "cli.html").read_text()
    assert "--short-side" in cli and "--storage-option" in cli  # the commands' own --help


def test_readme_is_read_in_ten_minutes() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, len(lines)
    text = "\n".join(lines[:20])
    assert "make demo" in text and "make test" in text  # the two commands on the first screen


def test_the_package_ships_its_type_information() -> None:
    import packer

    assert (Path(packer.__file__).parent / "py.typed").is_file()
