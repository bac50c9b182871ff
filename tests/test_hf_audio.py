"""A Hugging Face ``Audio`` column (issue 45 items 1, 2): a Parquet file written by the real
``datasets`` library converts without it into an ``audio`` field, each clip checked at
conversion as a class tree's clip is (a bad clip skipped with its reason), decoded on read to
``(waveform, sample_rate)``; ``output="bytes"`` gives the bytes ``datasets`` holds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.demo.audio import encode_clip, tone, wav_bytes

datasets = pytest.importorskip("datasets")  # the dev extra installs it
pytest.importorskip("av")

NAMES = ["yes", "no", "up"]


def _speech(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, list, list[bytes]]:
    """A Parquet of datasets with an Audio and a ClassLabel column: 3 good clips (two WAV, one
    FLAC), a row whose bytes are no audio, a truncated WAV and a clip given by a path beside the
    file. ``datasets`` encodes an Audio column through torchcodec, absent here, so the rows are
    written as ``{bytes, path}`` structs and cast to ``Audio()`` (the Arrow storage is the same)."""
    rng = np.random.default_rng(7)
    waves = [tone(rng, 1600), tone(rng, 2400, channels=2), tone(rng, 800)]
    clips = [wav_bytes(waves[0]), wav_bytes(waves[1]), encode_clip(waves[2], 16000, "flac")]
    clips += [b"RIFF\x10\x00\x00\x00WAVEnot a recording at all", wav_bytes(waves[0])[:200]]
    (tmp_path / "beside.wav").write_bytes(wav_bytes(waves[2]))
    rows = [{"bytes": c, "path": f"clip{i}.wav"} for i, c in enumerate(clips)]
    rows.append({"bytes": None, "path": "beside.wav"})
    raw = datasets.Features(
        {
            "audio": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")},
            "label": datasets.ClassLabel(names=NAMES),
        }
    )
    hf = datasets.Dataset.from_dict({"audio": rows, "label": [0, 1, 2, 0, 1, 2]}, features=raw)
    hf = hf.cast_column("audio", datasets.Audio())
    path = tmp_path / "train-00000-of-00001.parquet"
    monkeypatch.chdir(tmp_path)  # datasets sizes a relative path from the working folder
    hf.to_parquet(path)
    hf.select(range(3)).save_to_disk(str(tmp_path / "saved"))  # Arrow files: the good clips
    return path, [*waves, waves[2]], [*clips[:3], wav_bytes(waves[2])]


def _kinds(dst: Path) -> dict[str, str]:
    manifest = json.loads((dst / "packer.json").read_text())
    return {f["name"]: f["kind"] for f in manifest["options"]["fields"]}


def test_an_audio_column_converts_to_checked_clips_through_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, waves, stored = _speech(tmp_path, monkeypatch)
    result = CliRunner().invoke(main, ["convert", str(path), str(tmp_path / "o.lmdb")])
    assert result.exit_code == 0, result.output
    assert "fields audio (audio), label (int)" in result.output
    assert _kinds(tmp_path / "o.lmdb") == {"audio": "audio", "label": "int"}
    manifest = json.loads((tmp_path / "o.lmdb" / "packer.json").read_text())
    reasons = {s["path"].rpartition("[")[2]: s["reason"] for s in manifest["skipped"]}
    assert set(reasons) == {"3]", "4]"}
    assert (
        reasons["3]"] == "field 'audio': broken WAV header: a chunk runs past the end of the file"
    )
    assert reasons["4]"].startswith("field 'audio': truncated WAV")
    ds = packer.open_dataset(tmp_path / "o.lmdb", output="bytes")
    hf = datasets.load_dataset("parquet", data_files=str(path), split="train")
    hf = hf.cast_column("audio", datasets.Audio(decode=False))
    assert ds.classes == hf.features["label"].names == NAMES
    assert [bytes(ds[i]["audio"]) for i in range(len(ds))] == stored
    assert [bytes(hf[i]["audio"]["bytes"]) for i in range(3)] == stored[:3]
    assert [int(ds[i]["label"]) for i in range(len(ds))] == [0, 1, 2, 2]


def test_an_audio_column_decodes_to_waveform_and_rate_through_the_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, waves, _ = _speech(tmp_path, monkeypatch)
    result = packer.convert(path, tmp_path / "o.lmdb", progress=False)
    assert len(result.skipped) == 2 and result.manifest.num_samples == 4
    ds = packer.open_dataset(tmp_path / "o.lmdb", fields=("audio", "label"))
    for i, expected in enumerate(waves):
        (waveform, rate), label = ds[i]
        assert rate == 16000 and waveform.dtype == np.float32
        assert np.array_equal(waveform, expected.astype(np.float32) / 32768.0)  # FLAC lossless
    cropped = packer.open_dataset(
        tmp_path / "o.lmdb",
        fields=("audio",),
        output="tensor",
        mono=True,
        max_frames=1000,
        crop="start",
    )
    ((waveform, rate),) = cropped[1]
    assert tuple(waveform.shape) == (1, 1000) and rate == 16000
    both = waves[1][:, :1000].astype(np.float32) / 32768.0
    assert np.allclose(waveform.numpy(), both.mean(axis=0, keepdims=True), atol=1e-7)
    saved = packer.convert(tmp_path / "saved", tmp_path / "saved.lmdb", progress=False)
    assert {f["name"]: f["kind"] for f in saved.manifest.options["fields"]}["audio"] == "audio"
    ds = packer.open_dataset(tmp_path / "saved.lmdb", fields=("audio",))
    for i, expected in enumerate(waves[:3]):
        assert np.array_equal(ds[i][0][0], expected.astype(np.float32) / 32768.0)
