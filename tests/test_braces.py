"""Brace patterns of tar shards expand as bash expands them (issue 40, item 1): nested groups
outermost first, a brace that expands nothing kept as text; a pattern naming one shard twice
reads it once, never losing its samples as duplicate keys."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import packer
from packer.cli import main
from packer.demo.fields import make_caption_set, write_shards
from packer.source.tars import expand_braces

BASH = shutil.which("bash")


def _bash(pattern: str) -> list[str]:
    assert BASH is not None
    done = subprocess.run(
        [BASH, "-c", f"printf '%s\\n' {pattern}"], capture_output=True, text=True, check=True
    )
    return done.stdout.split("\n")[:-1]


_WORD = st.text("abcxyz", max_size=3)


def _ranges() -> st.SearchStrategy[str]:
    def one(lo: int, n: int, pad: bool) -> str:
        width = len(str(lo + n)) + 1 if pad else 0
        return "{" + str(lo).zfill(width) + ".." + str(lo + n) + "}"

    return st.builds(one, st.integers(0, 12), st.integers(0, 3), st.booleans())


def _patterns() -> st.SearchStrategy[str]:
    """Words, comma groups nested to any depth, numeric ranges and braces that expand nothing
    (``{a}``, a lone ``{``), concatenated."""
    leaf = st.one_of(_WORD, _ranges(), st.builds(lambda w: "{" + w + "}", _WORD))
    group = st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.builds(lambda xs: "{" + ",".join(xs) + "}", st.lists(inner, min_size=2, max_size=3)),
            st.builds(lambda a, b: a + b, inner, inner),
        ),
        max_leaves=8,
    )
    return st.builds(lambda p, tail: "s" + p + tail + ".tar", group, st.sampled_from(["", "{"]))


@settings(max_examples=150, deadline=None)
@given(_patterns())
def test_expansion_equals_bash(pattern: str) -> None:
    assert expand_braces(pattern) == _bash(pattern), pattern


def test_nested_groups_expand_outermost_first() -> None:
    assert expand_braces("x{a,{b,c}}y") == ["xay", "xby", "xcy"]
    assert expand_braces("{{a,b}}") == ["{a}", "{b}"]  # the outer group expands nothing
    assert expand_braces("s{01..3}") == ["s01", "s02", "s03"]  # padded as bash pads
    assert expand_braces("{a,b}{1..2}") == ["a1", "a2", "b1", "b2"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("braces")
    written = make_caption_set(root / "files", samples=9)
    paths = write_shards(written, root / "shards", per_shard=3)  # 000000..000002.tar
    for path, name in zip(paths, ("a", "b", "c")):
        path.rename(path.with_name(f"{name}.tar"))
    return root / "shards", written


@pytest.mark.parametrize("spelling", ["{a,{b,c}}", "{a,a,b,c}", "{{a,b},c,b}"])
def test_every_sample_of_every_shard_is_converted_once(
    shards: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path, spelling: str
) -> None:
    folder, written = shards
    dst = tmp_path / "out.lmdb"
    result = CliRunner().invoke(main, ["convert", str(folder / f"{spelling}.tar"), str(dst), "-q"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((dst / "packer.json").read_text())
    assert manifest["skipped"] == [], manifest["skipped"]  # no shard's samples lost as duplicates
    ds = packer.open_dataset(dst, output="bytes")
    got = {}
    for i in range(len(ds)):
        sample = dict(ds[i])
        key = sample.pop("__key__")
        got[key] = {f: v for f, v in sample.items() if v is not None}  # None: field absent
    assert len(ds) == len(written) and got == written
