"""Decode throughput of 1-second audio clips on one core: packer's decoders against soundfile
and a plain PyAV loop (issue 45 item 4, the audio part; it picked the decoders of
:mod:`packer.decode.audio`).

    python benchmarks/audio_decode.py [--clips 200] [--rate 16000] [--rounds 5]

Clips: ``--clips`` mono 16-bit clips of one second (packer's tone generator), as WAV, FLAC and
Ogg Opus (ffmpeg's encoders through PyAV). Each decoder turns a clip's bytes into a float32
``channels x frames`` array and its rate:

- packer: :func:`packer.decode.audio.decode_audio` (``wave`` + numpy for PCM WAV, PyAV else);
- soundfile: ``soundfile.read(BytesIO, dtype="float32", always_2d=True)`` (libsndfile), when it
  is importable (``--soundfile-path`` adds a folder it was installed into with ``pip install
  --target``; it is no dependency of packer);
- a plain PyAV loop written here (no torchaudio): ``av.open(BytesIO)``, every frame's
  ``to_ndarray()`` concatenated and scaled to float32.

Rounds run every decoder once over every clip, in turn (the order rotated each round); a
round's ratio compares two decoders' passes of that round. The JSON records clips/s per round,
the median, and packer's ratio to each other decoder per container: median, min, max.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from packer.decode.audio import decode_audio
from packer.demo.audio import encode_clip, tone

CONTAINERS = {"wav": "wav", "flac": "flac", "opus": "opus"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=200)
    parser.add_argument("--rate", type=int, default=16000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--soundfile-path", default="")
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results/audio_decode.json"
    )
    return parser.parse_args(argv)


def pyav_loop(data: bytes) -> tuple[np.ndarray, int]:
    """A plain PyAV decode of one clip: every frame to numpy, concatenated, as float32."""
    import av

    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        chunks = []
        for frame in container.decode(stream):
            array = frame.to_ndarray()
            if not frame.format.is_planar:
                array = array.reshape(-1, len(frame.layout.channels)).T
            if array.dtype == np.int16:
                array = array.astype(np.float32) / np.float32(32768.0)
            chunks.append(array.astype(np.float32, copy=False))
        return np.concatenate(chunks, axis=1), stream.rate


def decoders(soundfile_path: str) -> dict[str, Callable[[bytes], object]]:
    out: dict[str, Callable[[bytes], object]] = {
        "packer": lambda d: decode_audio(d),
        "pyav_loop": pyav_loop,
    }
    if soundfile_path:
        sys.path.append(soundfile_path)
    try:
        import soundfile

        def sf_read(data: bytes) -> object:
            array, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
            return array.T, rate

        out["soundfile"] = sf_read
    except ImportError:
        pass
    return out


def _pass(fn: Callable[[bytes], object], clips: list[bytes]) -> float:
    start = time.perf_counter()
    for data in clips:
        fn(data)
    return len(clips) / (time.perf_counter() - start)


def main(args: argparse.Namespace) -> dict[str, object]:
    rng = np.random.default_rng(0)
    samples = [tone(rng, args.rate, args.rate) for _ in range(args.clips)]
    encoded = {c: [encode_clip(x, args.rate, s) for x in samples] for c, s in CONTAINERS.items()}
    found = decoders(args.soundfile_path)
    for name, fn in found.items():  # warm-up, and every decoder gives the clip's frames
        for clips in encoded.values():
            waveform, _ = fn(clips[0])  # type: ignore[misc]
            assert np.asarray(waveform).shape[1] >= args.rate * 0.99, name
    rates: dict[str, dict[str, list[float]]] = {c: {n: [] for n in found} for c in encoded}
    names = list(found)
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for container, clips in encoded.items():
            for name in order:
                rates[container][name].append(_pass(found[name], clips))
    report: dict[str, object] = {
        "benchmark": "audio_decode",
        "command": " ".join([sys.executable, *sys.argv]),
        "machine": platform.node(),
        "clips": f"{args.clips} mono 16-bit clips of 1 s at {args.rate} Hz, one core",
        "clips_per_s": {c: {n: v for n, v in by.items()} for c, by in rates.items()},
        "median_clips_per_s": {
            c: {n: statistics.median(v) for n, v in by.items()} for c, by in rates.items()
        },
        "packer_ratio": {},
    }
    print(f"# {report['clips']}")
    print("| container | decoder | clips/s (median) | packer / it (median, min-max) |")
    print("|---|---|---:|---:|")
    for container, by in rates.items():
        ratios = {}
        for name, values in by.items():
            per_round = [p / v for p, v in zip(by["packer"], values)]
            if name != "packer":
                ratios[name] = {
                    "median": statistics.median(per_round),
                    "min": min(per_round),
                    "max": max(per_round),
                }
            shown = (
                f"{ratios[name]['median']:.2f}x ({ratios[name]['min']:.2f}-{ratios[name]['max']:.2f})"
                if name in ratios
                else ""
            )
            print(f"| {container} | {name} | {statistics.median(values):,.0f} | {shown} |")
        report["packer_ratio"][container] = ratios  # type: ignore[index]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main(parse_args())
