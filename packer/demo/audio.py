"""Generate audio class trees (``<class>/<clip>.wav``, the Speech Commands layout): the data of
the audio tests, docs and benchmarks.

A clip is a few tones with an envelope and noise, as 16-bit PCM: WAV through the stdlib
``wave`` module, FLAC/OGG/MP3/M4A through PyAV's encoders (the ``video`` extra). An ``.ogg``
is Vorbis when stereo (ffmpeg's own Vorbis encoder takes two channels only), else Opus.
"""

from __future__ import annotations

import io
import wave
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import PackerError

__all__ = ["AudioTree", "encode_clip", "make_audio_tree", "tone", "wav_bytes"]

_CODECS = {"flac": ("flac", "flac", "s16"), "ogg": ("ogg", "vorbis", "fltp")}
_CODECS |= {"oga": _CODECS["ogg"], "mp3": ("mp3", "libmp3lame", "fltp")}
_CODECS |= {"opus": ("ogg", "libopus", "flt"), "m4a": ("ipod", "aac", "fltp")}


def tone(rng: np.random.Generator, frames: int, rate: int = 16000, channels: int = 1) -> np.ndarray:
    """A clip as int16 samples, ``channels × frames``: two or three tones, an envelope, noise."""
    t = np.arange(frames, dtype=np.float64) / rate
    out = np.zeros((channels, frames), dtype=np.float64)
    for c in range(channels):
        for _ in range(int(rng.integers(2, 4))):
            freq = float(rng.uniform(110.0, min(4000.0, rate / 3)))
            out[c] += rng.uniform(0.1, 0.3) * np.sin(2 * np.pi * freq * t + rng.uniform(0, 6.3))
        out[c] *= np.hanning(frames) if frames > 1 else 1.0
        out[c] += 0.01 * rng.standard_normal(frames)
    return np.clip(np.round(out * 32767), -32768, 32767).astype(np.int16)


def wav_bytes(samples: np.ndarray, rate: int = 16000) -> bytes:
    """A 16-bit PCM WAV of int16 ``samples`` (``channels × frames``), by the stdlib ``wave``."""
    samples = np.atleast_2d(np.asarray(samples, dtype=np.int16))
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(samples.shape[0])
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.ascontiguousarray(samples.T).astype("<i2").tobytes())
    return buffer.getvalue()


def encode_clip(samples: np.ndarray, rate: int = 16000, suffix: str = "flac") -> bytes:
    """int16 ``samples`` (``channels × frames``) encoded as ``suffix`` (``wav``, ``flac``,
    ``ogg``/``oga``, ``opus``, ``mp3``); all but WAV need PyAV.

    Raises:
        PackerError: an unknown suffix, or PyAV missing or without the encoder.
    """
    suffix = suffix.lower().lstrip(".")
    if suffix == "wav":
        return wav_bytes(samples, rate)
    if suffix not in _CODECS:
        raise PackerError(f"cannot encode .{suffix}; expected wav, {', '.join(_CODECS)}")
    try:
        import av
    except ImportError:
        raise PackerError(
            f".{suffix} clips need PyAV: pip install 'packer-datasets[video]'"
        ) from None
    container_name, codec, fmt = _CODECS[suffix]
    samples = np.atleast_2d(np.asarray(samples, dtype=np.int16))
    channels = samples.shape[0]
    if codec == "vorbis" and channels != 2:  # ffmpeg's own Vorbis encoder is stereo only
        codec, fmt, suffix = _CODECS["opus"][1:] + ("opus",)
    layout = "mono" if channels == 1 else "stereo"
    if suffix == "opus":
        rate = 48000 if rate not in (8000, 12000, 16000, 24000, 48000) else rate
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_name) as out:
        stream: Any = out.add_stream(codec, rate=rate, layout=layout)
        stream.codec_context.options = {"strict": "experimental"}  # ffmpeg's own vorbis encoder
        block = 1024
        for start in range(0, samples.shape[1], block):
            frame = _frame(av, samples[:, start : start + block], fmt, layout)
            frame.sample_rate = rate
            frame.pts = start
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def _frame(av: Any, chunk: np.ndarray, fmt: str, layout: str) -> Any:
    if fmt == "s16":
        array = np.ascontiguousarray(chunk.T).reshape(1, -1)
    elif fmt == "flt":
        array = (np.ascontiguousarray(chunk.T).reshape(1, -1) / 32768.0).astype(np.float32)
    else:
        array = (chunk / 32768.0).astype(np.float32)
    return av.AudioFrame.from_ndarray(array, format=fmt, layout=layout)


@dataclass
class AudioTree:
    """What :func:`make_audio_tree` wrote: the root, the classes, the sound clips (path to its
    int16 samples) and the bad files (path to what is wrong with it)."""

    root: Path
    classes: list[str]
    clips: dict[str, np.ndarray] = field(default_factory=dict)
    rates: dict[str, int] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)


def make_audio_tree(
    root: str | Path,
    classes: tuple[str, ...] = ("no", "up", "yes"),
    per_class: int = 3,
    seconds: float = 0.5,
    rate: int = 16000,
    suffixes: tuple[str, ...] = (".wav",),
    channels: int = 1,
    bad: bool = False,
    seed: int = 0,
) -> AudioTree:
    """Write ``root/<class>/<n>.<suffix>`` clips (suffixes taken in turn), and with ``bad``
    a truncated WAV and a text file named ``.wav`` in the first class.

    Returns:
        the :class:`AudioTree` written.
    """
    rng = np.random.default_rng(seed)
    root = Path(root)
    tree = AudioTree(root, list(classes))
    frames = max(1, int(round(seconds * rate)))
    n = 0
    for name in classes:
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            suffix = suffixes[n % len(suffixes)]
            n += 1
            samples = tone(rng, frames, rate, channels)
            path = folder / f"{i:04d}{suffix}"
            path.write_bytes(encode_clip(samples, rate, suffix))
            tree.clips[str(path)] = samples
            tree.rates[str(path)] = rate
    if bad:
        first = root / classes[0]
        whole = wav_bytes(tone(rng, frames, rate, channels), rate)
        (first / "truncated.wav").write_bytes(whole[: len(whole) // 2])
        tree.bad[str(first / "truncated.wav")] = "truncated"
        (first / "notes.wav").write_bytes(b"this is a text file, not a recording\n" * 20)
        tree.bad[str(first / "notes.wav")] = "not audio"
    return tree
