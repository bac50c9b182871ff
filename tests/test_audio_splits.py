"""Class folders of clips under split roots (issue 45 item 2: audio as images are):
``train/<class>/x.wav`` and ``test/<class>/y.wav`` convert into one output with those splits and
one class index, the training split's folders, as image class trees do."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.demo.audio import make_audio_tree

pytest.importorskip("av")


def _cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def _speech(root: Path) -> tuple[object, object]:
    """train: no, up, yes (2 clips each); test: no, yes only (1 each), plus a broken clip."""
    train = make_audio_tree(root / "train", per_class=2, seed=1)
    test = make_audio_tree(root / "test", classes=("no", "yes"), per_class=1, bad=True, seed=2)
    return train, test


def _labels(ds: object) -> dict[str, int]:
    return {ds[i]["__key__"]: int(ds[i]["label"]) for i in range(len(ds))}  # type: ignore[index]


def test_split_roots_of_clips_convert_into_one_output_through_the_cli(tmp_path: Path) -> None:
    train, test = _speech(tmp_path / "speech")
    code, out = _cli("convert", tmp_path / "speech", tmp_path / "o.lmdb")
    assert code == 0, out
    assert "splits train, test (train 6, test 2)" in out
    top = json.loads((tmp_path / "o.lmdb" / "packer.json").read_text())
    assert top["kind"] == "splits" and top["options"]["kind"] == "fields"
    assert top["classes"] == ["no", "up", "yes"]
    ds = packer.open_dataset(tmp_path / "o.lmdb", split="test", output="bytes")
    assert ds.classes == ["no", "up", "yes"]
    assert _labels(ds) == {"no/0000": 0, "yes/0000": 2}  # the training split's index, not test's
    test_manifest = json.loads((tmp_path / "o.lmdb" / "test" / "packer.json").read_text())
    assert {Path(s["path"]).name for s in test_manifest["skipped"]} == {
        "truncated.wav",
        "notes.wav",
    }
    code, out = _cli("verify", tmp_path / "o.lmdb", "--full")
    assert code == 0 and "OK" in out, out


def test_split_roots_of_clips_through_the_api(tmp_path: Path) -> None:
    train, _ = _speech(tmp_path / "speech")
    result = packer.convert(tmp_path / "speech", tmp_path / "o.lmdb", progress=False)
    assert result.manifest.kind == "splits" and result.manifest.num_samples == 8
    ds = packer.open_dataset(
        tmp_path / "o.lmdb", split="train", fields=("__key__", "audio", "label")
    )
    assert len(ds) == 6
    for key, (waveform, rate), label in (ds[i] for i in range(len(ds))):
        path = str(tmp_path / "speech" / "train" / key) + ".wav"
        assert rate == 16000 and int(label) == ["no", "up", "yes"].index(key.split("/")[0])
        assert np.array_equal(waveform, train.clips[path].astype(np.float32) / 32768.0)


def test_a_split_with_a_class_the_training_split_lacks_is_refused(tmp_path: Path) -> None:
    _speech(tmp_path / "speech")
    make_audio_tree(tmp_path / "speech" / "test", classes=("down",), per_class=1)
    code, out = _cli("convert", tmp_path / "speech", tmp_path / "o.lmdb")
    assert code != 0 and "split 'test'" in out and "'down'" in out, out
    assert not (tmp_path / "o.lmdb").exists()
