"""Audio datasets under ``packer inspect`` and ``packer verify --full`` (issue 45 item 2):
inspect gives the clips, their total duration, sample rates and channels; verify --full decodes
every clip, so a clip whose header parses but whose stream does not decode is found."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.demo.audio import encode_clip, make_audio_tree, tone
from packer.read.describe import inspect_dict

pytest.importorskip("av")


def _cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def _mixed(dst: Path) -> None:
    """Clips of two rates, two channel counts, two containers; one sample without a clip."""
    rng = np.random.default_rng(5)
    clips = [
        encode_clip(tone(rng, 16000), 16000, "wav"),  # 1 s
        encode_clip(tone(rng, 4000, 8000, channels=2), 8000, "wav"),  # 0.5 s
        encode_clip(tone(rng, 4000), 16000, "flac"),  # 0.25 s
    ]
    with packer.Writer(dst, fields={"audio": "audio", "cls": "int"}) as writer:
        for i, clip in enumerate(clips):
            writer.write({"__key__": f"k{i}", "audio": clip, "cls": i})
        writer.write({"__key__": "none", "cls": 9})


def test_inspect_sums_durations_and_counts_rates(tmp_path: Path) -> None:
    _mixed(tmp_path / "w.lmdb")
    code, out = _cli("inspect", tmp_path / "w.lmdb")
    assert code == 0, out
    assert (
        "audio field 'audio': 3 clips, 1.8 s in all (mean 0.58 s, longest 1.00 s); sample rates: "
        "8000 Hz (1), 16000 Hz (2); channels: 1 (2), 2 (1)"
    ) in out
    (got,) = inspect_dict(tmp_path / "w.lmdb")["audio"]
    assert got["clips"] == 3 and got["seconds"] == pytest.approx(1.75)
    assert got["sample_rates"] == {"8000": 1, "16000": 2} and got["channels"] == {"1": 2, "2": 1}
    assert got["unknown_duration"] == got["unreadable"] == 0
    code, out = _cli("inspect", "--json", tmp_path / "w.lmdb")
    assert json.loads(out)["audio"] == [got]


def test_inspect_of_a_class_tree_of_clips(tmp_path: Path) -> None:
    tree = make_audio_tree(
        tmp_path / "speech", per_class=2, seconds=0.5, suffixes=(".wav", ".flac")
    )
    packer.convert(tree.root, tmp_path / "o.lmdb", progress=False)
    code, out = _cli("inspect", tmp_path / "o.lmdb")
    assert code == 0 and "audio field 'audio': 6 clips, 3.0 s in all" in out, out
    assert "sample rates: 16000 Hz (6)" in out


def test_verify_full_finds_a_clip_that_does_not_decode(tmp_path: Path) -> None:
    """A FLAC whose frames are zeroed keeps a good header: the fast check stores it, the
    checksums hold, and only decoding finds it."""
    tree = make_audio_tree(tmp_path / "speech", per_class=1, suffixes=(".flac",))
    damaged = Path(sorted(tree.clips)[0])
    data = damaged.read_bytes()
    damaged.write_bytes(data[:200] + bytes(len(data) - 200))
    packer.convert(tree.root, tmp_path / "o.lmdb", check="fast", progress=False)
    assert packer.verify(tmp_path / "o.lmdb").ok  # the stored bytes are the file's
    report = packer.verify(tmp_path / "o.lmdb", full=True)
    assert not report.ok and report.decoded == 2 * 3 - 1
    (problem,) = report.problems
    assert damaged.relative_to(tree.root).with_suffix("").as_posix() in str(problem)
    assert "decodes to no frames" in str(problem)
    code, out = _cli("verify", tmp_path / "o.lmdb", "--full")
    assert code != 0 and "decodes to no frames" in out, out
