"""Audio clips: checked at conversion, decoded on read to ``(waveform, sample_rate)``.

A clip is stored as its file's bytes, unchanged (``.wav .flac .mp3 .ogg .oga .opus .m4a``). On
read it decodes as ``torchaudio.load`` gives it: a float32 waveform of ``channels × frames`` and
the sample rate; integer PCM is scaled to [-1, 1) by the full scale of its width (16-bit:
``int16 / 32768.0``, bit-exact; 8-bit ``(u8 - 128) / 128``; 24/32-bit ``/ 2**23`` / ``2**31``).

Two decoders, picked by the bytes: a PCM WAV (8/16/24/32-bit integers) is parsed by the stdlib
``wave`` module and scaled by numpy (a crop reads only its frames); anything else — FLAC, Ogg
Vorbis/Opus, MP3, AAC in MP4, float WAV — through PyAV (the ``video`` extra), the container
restricted to :data:`CONTAINERS` before ffmpeg reads a header. Measured on 1-second 16 kHz
clips (``benchmarks/audio_decode.py``), ``wave`` + numpy decodes a WAV ~5x faster than
soundfile and ~100x faster than PyAV; PyAV decodes Opus ~2x faster than soundfile but FLAC ~3x
slower. WAV is what speech sets ship, so packer takes no soundfile dependency.

The check (:func:`check_audio`): the header parsed (a WAV's by ``wave``, any other by ffmpeg's
demuxer: of an allowed container, with an audio stream) and, unless ``check="fast"``, the whole
stream decoded, with at least the frames its header declares: a truncated or non-audio file
is an :class:`AudioError`, and a conversion skips it with that reason.
"""

from __future__ import annotations

import dataclasses
import io
import os
import random
import wave
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.core.fields import AUDIO_SUFFIXES
from packer.errors import InputFileError, PackerError

__all__ = [
    "AUDIO_SUFFIXES",
    "CONTAINERS",
    "CROPS",
    "AudioError",
    "AudioInfo",
    "AudioOptions",
    "check_audio",
    "check_audio_options",
    "decode_audio",
    "probe_audio",
]

# ffmpeg demuxers a clip may be read by (its short names, ffmpeg's format_whitelist): never a
# playlist or a concatenation that would open other files or URLs.
CONTAINERS = ("wav", "flac", "mp3", "ogg", "mov")
CROPS = ("random", "start", "center")
_SCALE = {1: 128.0, 2: 32768.0, 3: 8388608.0, 4: 2147483648.0}  # full scale by sample width
_AV_SCALE = {"u8": 128.0, "s16": 32768.0, "s32": 2147483648.0, "flt": 1.0, "dbl": 1.0}


class AudioError(InputFileError, ValueError):
    """One clip's bytes are not a usable audio file (the reason says why)."""


@dataclass(frozen=True)
class AudioInfo:
    """What a clip's header says: its container, sample rate, channels and frames."""

    format: str
    sample_rate: int
    channels: int
    frames: int

    @property
    def seconds(self) -> float:
        """The clip's duration."""
        return self.frames / self.sample_rate if self.sample_rate else 0.0


@dataclass(frozen=True)
class AudioOptions:
    """How audio fields are decoded on read (each ``None`` keeps the clip as stored).

    Attributes:
        sample_rate: resample every clip to this rate (Hz), through PyAV's resampler.
        mono: ``True`` averages the channels into one (torchaudio's ``mean(0, keepdim=True)``).
        max_frames: at most this many frames (at the returned rate): a crop of a longer clip.
            A shorter clip is returned whole.
        crop: where the crop starts: ``"random"`` (the default; Python's ``random``, which each
            DataLoader worker seeds apart), ``"start"`` or ``"center"``.
    """

    sample_rate: int | None = None
    mono: bool | None = None
    max_frames: int | None = None
    crop: str | None = None

    def __post_init__(self) -> None:
        for name in ("sample_rate", "max_frames"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or not 1 <= value <= 2**31 - 1):
                raise PackerError(f"invalid {name}={value!r}; expected a positive int or None")
        if self.mono is not None and not isinstance(self.mono, bool):
            raise PackerError(f"invalid mono={self.mono!r}; expected True, False or None")
        if self.crop is not None and self.crop not in CROPS:
            raise PackerError(f"invalid crop={self.crop!r}; expected one of {', '.join(CROPS)}")
        if self.crop is not None and self.max_frames is None:
            raise PackerError(f"crop={self.crop!r} needs max_frames= (the crop's length)")


def check_audio_options(
    options: AudioOptions, kinds: list[str], where: str | os.PathLike[str]
) -> None:
    """Refuse audio options for a dataset whose fields read hold no clip.

    Raises:
        PackerError: an option given while no field of ``kinds`` is ``audio``.
    """
    given = [k for k, v in dataclasses.asdict(options).items() if v is not None]
    if given and "audio" not in kinds:
        raise PackerError(
            f"{given[0]}= applies to audio fields, and {str(where)!r} reads none; drop it"
        )


def _is_wav(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == b"RIFF" and bytes(data[8:12]) == b"WAVE"


def _open_wav(data: bytes | memoryview) -> wave.Wave_read | None:
    """A reader of a PCM WAV, or None when ``wave`` cannot read its format (float,
    WAVE_FORMAT_EXTENSIBLE: PyAV can).

    Raises:
        AudioError: a WAV whose header is broken.
    """
    try:
        return wave.open(io.BytesIO(bytes(data)), "rb")
    except wave.Error as exc:
        if "unknown format" in str(exc):
            return None
        raise AudioError(f"broken WAV header: {exc}") from None
    except EOFError:
        raise AudioError("truncated WAV (its header or its data chunk is missing)") from None
    except RuntimeError:  # wave's chunk reader, on a chunk running past the file's end
        raise AudioError("broken WAV header: a chunk runs past the end of the file") from None


def _wav_frames(reader: wave.Wave_read, start: int, count: int) -> np.ndarray:
    """Frames ``start`` .. ``start + count`` of a PCM WAV as float32 ``channels × frames``."""
    channels, width = reader.getnchannels(), reader.getsampwidth()
    if width not in _SCALE:
        raise AudioError(f"a WAV of {8 * width}-bit samples (expected 8, 16, 24 or 32)")
    reader.setpos(start)
    raw = reader.readframes(count)
    if len(raw) != count * channels * width:
        got = len(raw) // (channels * width)
        raise AudioError(
            f"truncated WAV: {start + got} of the {reader.getnframes()} frames its header declares"
        )
    ints: np.ndarray
    if width == 1:
        ints = np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0
    elif width == 3:
        bytes3 = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        ints = (bytes3[:, 0] | (bytes3[:, 1] << 8) | (bytes3[:, 2] << 16)) << 8 >> 8
    else:
        ints = np.frombuffer(raw, dtype="<i2" if width == 2 else "<i4")
    wave_ = ints.astype(np.float32) / np.float32(_SCALE[width])
    return np.ascontiguousarray(wave_.reshape(-1, channels).T)


def _av() -> Any:
    try:
        import av
    except ImportError:
        raise PackerError(
            "decoding audio other than PCM WAV needs PyAV: pip install 'packer-datasets[video]'"
        ) from None
    return av


def _open_av(data: bytes | memoryview) -> tuple[Any, Any]:
    """The opened container and its first audio stream.

    Raises:
        AudioError: bytes no allowed container holds, or a container with no audio stream.
    """
    av = _av()
    try:
        container = av.open(
            io.BytesIO(bytes(data)), container_options={"format_whitelist": ",".join(CONTAINERS)}
        )
    except Exception as exc:  # any ffmpeg error on one file's bytes is that file's reason
        raise AudioError(
            f"not an audio file (of {', '.join(AUDIO_SUFFIXES)}): {_reason(exc)}"
        ) from None
    if not container.streams.audio:
        container.close()
        raise AudioError(f"a {container.format.name} file with no audio stream")
    return container, container.streams.audio[0]


def _reason(exc: BaseException) -> str:
    """What ffmpeg (or another library) said, without its error number."""
    said = getattr(exc, "strerror", None) or str(exc)
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


def _stream_info(container: Any, stream: Any) -> AudioInfo:
    """What an opened stream's header says.

    Raises:
        AudioError: a stream whose codec parameters are missing (no rate, no channel layout).
    """
    try:
        return AudioInfo(
            container.format.name,
            int(stream.rate or 0),
            len(stream.layout.channels),
            _declared(stream),
        )
    except AttributeError:  # PyAV leaves them out of a stream ffmpeg could not open a codec for
        container.close()
        raise AudioError(
            f"a {container.format.name} file whose audio stream has no codec"
        ) from None


def _declared(stream: Any) -> int:
    """The frames a stream's header declares (-1: unknown)."""
    if stream.duration is None or stream.time_base is None or not stream.rate:
        return -1
    return int(round(float(stream.duration * stream.time_base) * stream.rate))


def _planar(frame: Any) -> np.ndarray:
    """One decoded PyAV frame as float32 ``channels × samples``."""
    name = frame.format.name
    array = frame.to_ndarray()
    if not frame.format.is_planar:
        array = array.reshape(-1, len(frame.layout.channels)).T
    base = name[:-1] if name.endswith("p") else name
    if base == "u8":
        return (array.astype(np.float32) - 128.0) / np.float32(128.0)
    scale = _AV_SCALE.get(base)
    if scale is None:
        raise AudioError(f"decoded to sample format {name!r}, which packer does not convert")
    return (
        array.astype(np.float32) / np.float32(scale) if scale != 1.0 else array.astype(np.float32)
    )


def _decode_av(
    data: bytes | memoryview, rate: int | None = None, stop: int | None = None
) -> tuple[np.ndarray, int, AudioInfo]:
    """The clip decoded by PyAV (resampled to ``rate`` if given; decoding ends once ``stop``
    frames are out), its rate, and what its header declared."""
    av = _av()
    container, stream = _open_av(data)
    info = _stream_info(container, stream)
    chunks: list[np.ndarray] = []
    got = 0
    try:
        with container:
            resampler = None
            if rate is not None and rate != info.sample_rate:
                resampler = av.AudioResampler(format="fltp", rate=rate)
            for frame in container.decode(stream):
                for out in resampler.resample(frame) if resampler else [frame]:
                    chunks.append(_planar(out))
                    got += chunks[-1].shape[1]
                if stop is not None and got >= stop:
                    break
            else:
                for out in resampler.resample(None) if resampler else []:
                    chunks.append(_planar(out))
    except AudioError:
        raise
    except Exception as exc:  # whatever ffmpeg raises on this clip's bytes
        raise AudioError(f"broken {info.format} stream: {_reason(exc)}") from None
    if not chunks:
        raise AudioError(f"a {info.format} file whose stream decodes to no frames")
    out_rate = rate if resampler is not None and rate is not None else info.sample_rate
    return np.concatenate(chunks, axis=1), out_rate, info


def check_audio(data: bytes | memoryview, check: str = "scan") -> AudioInfo:
    """What ``data``'s header says, once it is known to be a usable clip: the header parsed
    and, unless ``check="fast"``, the stream decoded with the frames its header declares.

    Raises:
        AudioError: an empty, truncated or non-audio file, with the reason.
    """
    if len(data) == 0:
        raise AudioError("empty file (0 bytes)")
    if _is_wav(data):
        reader = _open_wav(data)
        if reader is not None:
            with reader:
                frames = reader.getnframes()
                if frames == 0:
                    raise AudioError("a WAV of no frames")
                _wav_frames(reader, 0, frames)  # a memory copy: the WAV's check is always whole
                return AudioInfo("wav", reader.getframerate(), reader.getnchannels(), frames)
    if check == "fast":
        container, stream = _open_av(data)
        with container:
            return _stream_info(container, stream)
    waveform, _, info = _decode_av(data)
    decoded = waveform.shape[1]
    if info.frames > 0 and decoded + max(2048, info.frames // 50) < info.frames:
        raise AudioError(
            f"truncated {info.format}: {decoded} of the {info.frames} frames its header declares"
        )
    return AudioInfo(info.format, info.sample_rate, info.channels, max(info.frames, decoded))


def probe_audio(data: bytes | memoryview) -> AudioInfo:
    """What a clip's header says, nothing decoded (``frames`` is -1 when the container does not
    declare its duration).

    Raises:
        AudioError: bytes whose header does not parse.
    """
    if len(data) == 0:
        raise AudioError("empty file (0 bytes)")
    reader = _open_wav(data) if _is_wav(data) else None
    if reader is not None:
        with reader:
            return AudioInfo(
                "wav", reader.getframerate(), reader.getnchannels(), reader.getnframes()
            )
    container, stream = _open_av(data)
    with container:
        return _stream_info(container, stream)


def _crop_start(total: int, length: int, crop: str | None) -> int:
    if total <= length or crop == "start":
        return 0
    if crop == "center":
        return (total - length) // 2
    return random.randrange(total - length + 1)


def decode_audio(
    data: bytes | memoryview, output: str = "numpy", options: AudioOptions | None = None
) -> tuple[Any, int]:
    """``(waveform, sample_rate)`` of one clip: float32 ``channels × frames`` as a numpy array
    (``output="numpy"``, or ``"pil"``, which concerns images only) or a torch tensor
    (``"tensor"``), after the ``options`` (resample, crop, mono, in that order).

    Raises:
        AudioError: bytes that do not decode, with the reason.
    """
    options = options or AudioOptions()
    length = options.max_frames
    reader = _open_wav(data) if _is_wav(data) else None
    if reader is not None and options.sample_rate in (None, reader.getframerate()):
        with reader:
            total = reader.getnframes()
            count = total if length is None else min(length, total)
            start = _crop_start(total, count, options.crop)
            waveform, rate = _wav_frames(reader, start, count), reader.getframerate()
    else:
        fixed = length is not None and options.crop in ("start",)
        waveform, rate, _ = _decode_av(data, options.sample_rate, length if fixed else None)
        if length is not None:
            start = _crop_start(waveform.shape[1], length, options.crop)
            waveform = waveform[:, start : start + length]
    if options.mono and waveform.shape[0] > 1:
        waveform = waveform.mean(axis=0, keepdims=True, dtype=np.float32)
    if output == "tensor":
        import torch

        return torch.from_numpy(np.ascontiguousarray(waveform)), rate
    return np.ascontiguousarray(waveform), rate
