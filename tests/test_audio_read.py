"""Audio on read (issue 45 item 2): clips decode to ``(waveform, sample_rate)`` as torchaudio
gives them — 16-bit PCM bit-exact — with the reader options checked, in DataLoader workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import packer
from packer.decode.audio import AudioOptions, decode_audio
from packer.demo.audio import encode_clip, make_audio_tree, tone, wav_bytes

av = pytest.importorskip("av")


@pytest.fixture(scope="module")
def stereo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """A converted tree of stereo 16-bit WAV and FLAC clips, and each key's int16 samples."""
    root = tmp_path_factory.mktemp("audio")
    tree = make_audio_tree(root / "src", suffixes=(".wav", ".flac"), channels=2, seconds=0.25)
    packer.convert(tree.root, root / "o.lmdb", progress=False)
    samples = {
        str(Path(p).relative_to(tree.root).with_suffix("")): s for p, s in tree.clips.items()
    }
    return root / "o.lmdb", samples


def test_16_bit_pcm_decodes_bit_exact_as_channels_by_frames(stereo: tuple) -> None:
    dst, samples = stereo
    ds = packer.open_dataset(dst, fields=("__key__", "audio", "label"), output="numpy")
    for i in range(len(ds)):
        key, (waveform, rate), label = ds[i]
        expected = samples[key].astype(np.float32) / 32768.0  # torchaudio.load's scaling
        assert waveform.dtype == np.float32 and waveform.shape == (2, 4000)
        assert rate == 16000 and np.array_equal(waveform, expected)
        assert label == ds.classes.index(key.split("/")[0])
    tensors = packer.open_dataset(dst, fields=("audio",), output="tensor")
    waveform, rate = tensors[0][0]
    assert isinstance(waveform, torch.Tensor) and waveform.dtype == torch.float32
    assert torch.equal(waveform, torch.from_numpy(samples[tensors.keys[0]] / np.float32(32768)))


def test_mono_averages_the_channels_and_a_fixed_crop_is_a_slice(stereo: tuple) -> None:
    dst, samples = stereo
    for crop, start in (("start", 0), ("center", (4000 - 1000) // 2)):
        ds = packer.open_dataset(
            dst, fields=("__key__", "audio"), mono=True, max_frames=1000, crop=crop
        )
        for i in range(len(ds)):
            key, (waveform, _) = ds[i]
            full = samples[key].astype(np.float32) / 32768.0
            expected = full.mean(axis=0, keepdims=True)[:, start : start + 1000]
            assert waveform.shape == (1, 1000) and np.allclose(waveform, expected, atol=1e-7)


def test_a_random_crop_is_a_window_of_the_clip_and_moves() -> None:
    samples = tone(np.random.default_rng(4), 4000, channels=1)
    data = wav_bytes(samples)
    full = samples[0].astype(np.float32) / 32768.0
    starts = set()
    for _ in range(20):
        waveform, _ = decode_audio(data, options=AudioOptions(max_frames=500))
        window = np.lib.stride_tricks.sliding_window_view(full, 500)
        hits = np.flatnonzero((window == waveform[0]).all(axis=1))
        assert len(hits) >= 1
        starts.add(int(hits[0]))
    assert len(starts) > 1
    short, _ = decode_audio(data, options=AudioOptions(max_frames=10_000))
    assert short.shape == (1, 4000)  # a shorter clip comes whole


def test_resampling_gives_the_asked_rate(tmp_path: Path) -> None:
    data = encode_clip(tone(np.random.default_rng(5), 16000, channels=1), 16000, "flac")
    waveform, rate = decode_audio(data, options=AudioOptions(sample_rate=8000))
    assert rate == 8000 and abs(waveform.shape[1] - 8000) <= 64
    same, rate = decode_audio(data, options=AudioOptions(sample_rate=16000))
    assert rate == 16000 and same.shape == (1, 16000)


def test_flac_decodes_to_the_same_samples_as_the_wav(tmp_path: Path) -> None:
    samples = tone(np.random.default_rng(6), 3000, channels=2)
    from_wav, _ = decode_audio(wav_bytes(samples))
    from_flac, _ = decode_audio(encode_clip(samples, 16000, "flac"))
    assert np.array_equal(from_wav, from_flac)  # lossless through PyAV: the same floats


def test_reader_options_are_checked(stereo: tuple, tmp_path: Path) -> None:
    dst, _ = stereo
    for bad, match in (
        ({"max_frames": 0}, "invalid max_frames"),
        ({"sample_rate": 16000.0}, "invalid sample_rate"),
        ({"mono": "yes"}, "invalid mono"),
        ({"crop": "start"}, "needs max_frames"),
        ({"max_frames": 10, "crop": "middle"}, "invalid crop"),
    ):
        with pytest.raises(packer.PackerError, match=match):
            packer.open_dataset(dst, **bad)
    with pytest.raises(packer.PackerError, match="did you mean 'sample_rate'"):
        packer.open_dataset(dst, sampl_rate=8000)
    with pytest.raises(packer.PackerError, match="applies to audio fields"):
        packer.open_dataset(dst, fields=("label",), mono=True)


def test_bytes_output_is_the_stored_file(stereo: tuple) -> None:
    dst, _ = stereo
    ds = packer.open_dataset(dst, fields=("audio",), output="bytes")
    data = ds[0][0]
    assert isinstance(data, bytes) and data[:4] in (b"RIFF", b"fLaC")


def test_a_dataloader_with_two_workers_reads_every_clip(stereo: tuple) -> None:
    dst, samples = stereo
    ds = packer.FieldDataset(
        dst, fields=("__key__", "audio", "label"), output="tensor", max_frames=800, crop="start"
    )
    loader = DataLoader(
        ds,
        batch_size=4,
        num_workers=2,
        collate_fn=packer.collate_fields,
        multiprocessing_context="forkserver",
    )
    seen = {}
    for keys, audio, labels in loader:
        for key, (waveform, rate), label in zip(keys, audio, labels.tolist()):
            assert rate == 16000 and label == ds.classes.index(key.split("/")[0])
            seen[key] = waveform
    assert sorted(seen) == sorted(samples)
    for key, waveform in seen.items():
        expected = samples[key][:, :800].astype(np.float32) / 32768.0
        assert torch.equal(waveform, torch.from_numpy(expected))
