"""Audio (issue 45 item 2): class folders of clips and audio fields convert, checked; bad clips
are skipped and listed; the stored bytes are the files' bytes."""

from __future__ import annotations

import json
import wave
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.decode.audio import AudioError, check_audio
from packer.demo.audio import encode_clip, make_audio_tree, tone, wav_bytes

av = pytest.importorskip("av")


def _cli(*args: object) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result.exit_code, result.output


def _skipped(dst: Path) -> dict[str, str]:
    manifest = json.loads((dst / "packer.json").read_text())
    return {Path(s["path"]).name: s["reason"] for s in manifest["skipped"]}


def test_a_class_tree_of_clips_converts_through_the_cli(tmp_path: Path) -> None:
    tree = make_audio_tree(tmp_path / "speech", suffixes=(".wav", ".flac", ".ogg"), bad=True)
    code, out = _cli("convert", tree.root, tmp_path / "o.lmdb")
    assert code == 0, out
    assert "audio clips in class folders" in out and "audio (audio), label (int)" in out
    skipped = _skipped(tmp_path / "o.lmdb")
    assert skipped["truncated.wav"].startswith("field 'audio': truncated WAV: ")
    assert "not an audio file" in skipped["notes.wav"]
    ds = packer.open_dataset(tmp_path / "o.lmdb", output="bytes")
    assert ds.classes == ["no", "up", "yes"]
    assert len(ds) == len(tree.clips) == 9
    by_key = {str(Path(p).relative_to(tree.root).with_suffix("")): p for p in tree.clips}
    for i in range(len(ds)):
        sample = ds[i]
        path = by_key[sample["__key__"]]
        assert sample["audio"] == Path(path).read_bytes()  # stored unchanged
        assert int(sample["label"]) == tree.classes.index(Path(path).parent.name)


def test_an_image_tree_is_not_taken_for_clips(tmp_path: Path) -> None:
    """A class folder holding an image and a clip is an image tree (its clips ignored)."""
    from packer.demo.image import make_image_tree

    make_image_tree(tmp_path / "src", classes=2, per_class=2)
    first = sorted(p for p in (tmp_path / "src").iterdir() if p.is_dir())[0]
    (first / "x.wav").write_bytes(wav_bytes(np.zeros((1, 10), np.int16)))
    result = packer.convert(tmp_path / "src", tmp_path / "o.lmdb", progress=False)
    assert result.manifest.kind == "image"


def test_a_tree_of_no_clips_says_so(tmp_path: Path) -> None:
    (tmp_path / "src" / "yes").mkdir(parents=True)
    (tmp_path / "src" / "yes" / "a.txt").write_text("x")
    with pytest.raises(packer.PackerError, match="no audio clips"):
        packer.convert(tmp_path / "src", tmp_path / "o.lmdb", kind="audio", progress=False)


def test_key_grouped_wav_beside_txt_is_an_audio_field(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(1)
    clips = {f"{i:04d}": tone(rng, 800) for i in range(3)}
    for key, samples in clips.items():
        (src / f"{key}.wav").write_bytes(wav_bytes(samples))
        (src / f"{key}.txt").write_text(f"caption {key}")
    (src / "0009.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    (src / "0009.txt").write_text("a broken one")
    result = packer.convert(src, tmp_path / "o.lmdb", progress=False)
    kinds = {f["name"]: f["kind"] for f in result.manifest.options["fields"]}
    assert kinds == {"txt": "text", "wav": "audio"}
    assert "0009.wav" in _skipped(tmp_path / "o.lmdb") or any(
        "0009" in s.path for s in result.skipped
    )
    ds = packer.open_dataset(tmp_path / "o.lmdb", fields=("__key__", "wav", "txt"))
    for key, (waveform, rate), text in (ds[i] for i in range(len(ds))):
        assert rate == 16000 and text == f"caption {key}"
        assert np.array_equal(waveform, clips[key].astype(np.float32) / 32768.0)


def test_writer_takes_the_bytes_of_a_clip_and_refuses_others(tmp_path: Path) -> None:
    clip = encode_clip(tone(np.random.default_rng(2), 1600), 16000, "flac")
    with packer.Writer(tmp_path / "w.lmdb") as writer:
        writer.write({"__key__": "a", "flac": clip, "cls": 1})
        with pytest.raises(packer.InputFileError, match="truncated|broken|not an audio"):
            writer.write({"__key__": "b", "flac": clip[: len(clip) // 2], "cls": 2})
        with pytest.raises(packer.InputFileError, match="kind 'audio' takes the bytes"):
            writer.write({"__key__": "c", "flac": [1, 2, 3], "cls": 2})
    ds = packer.open_dataset(tmp_path / "w.lmdb", fields=("flac",), output="bytes")
    assert len(ds) == 1 and ds[0][0] == clip


@pytest.mark.parametrize("suffix", [".flac", ".ogg", ".mp3", ".m4a", ".opus"])
def test_a_truncated_clip_of_every_container_is_refused(suffix: str) -> None:
    data = encode_clip(tone(np.random.default_rng(3), 16000, channels=2), 16000, suffix)
    info = check_audio(data)
    assert info.channels == 2 and info.frames >= 16000
    with pytest.raises(AudioError):
        check_audio(data[: len(data) // 2])


def test_not_audio_is_refused_with_its_reason() -> None:
    with pytest.raises(AudioError, match="empty file"):
        check_audio(b"")
    with pytest.raises(AudioError, match="not an audio file"):
        check_audio(b"just some text, not a recording " * 30)
    png = bytes.fromhex("89504e470d0a1a0a") + b"\x00" * 200
    with pytest.raises(AudioError, match="not an audio file"):
        check_audio(png)
    with pytest.raises(AudioError, match="no frames"):
        check_audio(wav_bytes(np.zeros((1, 0), np.int16)))


def test_a_wav_header_that_lies_is_refused_with_its_reason() -> None:
    """A chunk longer than the file (Python's wave raises a bare RuntimeError) and a format tag
    no decoder knows (PyAV opens a stream without a codec) are AudioErrors, not crashes."""
    from packer.decode.audio import decode_audio

    good = wav_bytes(tone(np.random.default_rng(4), 400))
    past_end = b"RIFF\x10\x00\x00\x00WAVEjunk" + (1000).to_bytes(4, "little") + b"x" * 20
    unknown = good[:20] + b"\x00\x00" + good[22:]  # format tag 0
    for data, says in [(past_end, "a chunk runs past the end"), (unknown, "has no codec")]:
        for call in (check_audio, decode_audio):
            with pytest.raises(AudioError, match=says):
                call(data)


def test_verify_full_decodes_every_clip(tmp_path: Path) -> None:
    tree = make_audio_tree(tmp_path / "speech", per_class=2)
    packer.convert(tree.root, tmp_path / "o.lmdb", progress=False)
    assert packer.verify(tmp_path / "o.lmdb", full=True).ok
    code, out = _cli("verify", tmp_path / "o.lmdb", "--full")
    assert code == 0, out


def test_wav_header_parse_reads_pcm_widths() -> None:
    """8- and 24-bit PCM WAVs decode scaled by their full scale, as torchaudio does."""
    import io

    from packer.decode.audio import decode_audio

    for width, scale, ints in (
        (1, 128.0, np.array([0, 128, 255], np.int32)),
        (3, 2.0**23, np.array([-(2**23), 0, 2**23 - 1], np.int32)),
    ):
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(width)
            out.setframerate(8000)
            raw = (
                ints.astype(np.uint8).tobytes()
                if width == 1
                else b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints)
            )
            out.writeframes(raw)
        waveform, rate = decode_audio(buffer.getvalue())
        expected = (ints - 128) / 128.0 if width == 1 else ints / scale
        assert rate == 8000 and np.array_equal(waveform[0], expected.astype(np.float32))
