"""Decode throughput of 1-second audio clips on one core: packer's decoders against soundfile
and a plain PyAV loop (issue 45 item 4, the audio part; it picked the decoders of
:mod:`packer.decode.audio`).

    python benchmarks/audio_decode.py [--clips 200] [--rate 16000] [--repeats 5]

soundfile is measured when it is importable (``--soundfile-path`` adds a folder it was
installed into with ``pip install --target``); it is no dependency of packer.
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

import numpy as np

from packer.decode.audio import _decode_av, decode_audio
from packer.tools.audio_demo import encode_clip, tone


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=200)
    parser.add_argument("--rate", type=int, default=16000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--soundfile-path", default="")
    parser.add_argument("--json", default="")
    return parser.parse_args(argv)


def _rate(fn: Callable[[bytes], object], clips: list[bytes], repeats: int) -> float:
    for data in clips[:10]:  # warm-up
        fn(data)
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for data in clips:
            fn(data)
        runs.append(len(clips) / (time.perf_counter() - start))
    return statistics.median(runs)


def main(args: argparse.Namespace) -> dict[str, float]:
    rng = np.random.default_rng(0)
    samples = [tone(rng, args.rate, args.rate) for _ in range(args.clips)]
    encoded = {s: [encode_clip(x, args.rate, s) for x in samples] for s in ("wav", "flac", "ogg")}
    decoders: dict[str, tuple[str, Callable[[bytes], object]]] = {
        "packer wav (wave + numpy)": ("wav", lambda d: decode_audio(d)),
        "PyAV loop, wav": ("wav", lambda d: _decode_av(d)),
        "packer flac (PyAV)": ("flac", lambda d: decode_audio(d)),
        "packer ogg vorbis (PyAV)": ("ogg", lambda d: decode_audio(d)),
    }
    if args.soundfile_path:
        sys.path.append(args.soundfile_path)
    try:
        import soundfile

        def sf_read(data: bytes) -> object:
            array, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
            return array.T, rate

        decoders["soundfile, wav"] = ("wav", sf_read)
        decoders["soundfile, flac"] = ("flac", sf_read)
        decoders["soundfile, ogg vorbis"] = ("ogg", sf_read)
    except ImportError:
        pass
    results = {name: _rate(fn, encoded[s], args.repeats) for name, (s, fn) in decoders.items()}
    print(
        f"# {args.clips} clips of 1 s at {args.rate} Hz, mono 16-bit, one core, {platform.node()}"
    )
    print("| decoder | clips/s |\n|---|---:|")
    for name, value in results.items():
        print(f"| {name} | {value:,.0f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)
    return results


if __name__ == "__main__":
    main(parse_args())
