"""When decode is the bottleneck: which decoder, and which write-time resize, and what they save.

``packer doctor`` calls :func:`decode_advice` with a few stored samples of the dataset. It times
each installed decoder on them (same bytes, same process), reads their sizes from the headers,
and returns findings and recommendations with the command line to type: the decoder its own
measurement finds fastest (:func:`choose_decoder`: "Pillow is fastest here" is an answer; a
difference under 10 % keeps the default), ``pip install packer-datasets[fast]`` when only
Pillow is installed, and for images larger than 256 px on
the short side, a conversion with ``--short-side 256`` (decode cost scales with pixels).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.decode.fast import MISSING, SPEED_ORDER, jpeg_info
from packer.decode.outputs import decode
from packer.decode.registry import check_decoder, decoders_for, sniff
from packer.errors import PackerError

__all__ = ["MARGIN", "DecodeAdvice", "choose_decoder", "decode_advice"]

SHORT_SIDE = 256  # what the recipe stores: FFCV's and the speed-runs' training resolution
ROUNDS = 3  # interleaved timing passes per decoder
MARGIN = 0.10  # another decoder must beat the default by more than this to be recommended
NAMES = {"pillow": "Pillow", "simplejpeg": "simplejpeg", "turbojpeg": "PyTurboJPEG",
         "opencv": "OpenCV"}  # fmt: skip


@dataclass
class DecodeAdvice:
    """Per-decoder decode time (ms per sample) and what to do about it."""

    ms: dict[str, float] = field(default_factory=dict)
    short_side: float | None = None  # mean short side of the sampled JPEGs
    findings: list[str] = field(default_factory=list)
    recommendations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"decode_ms": self.ms, "mean_short_side": self.short_side}


def choose_decoder(ms: dict[str, float], default: str, margin: float = MARGIN) -> str:
    """The decoder to recommend from measured milliseconds per sample (by decoder name).

    The fastest measured decoder, when it beats ``default`` (what ``decoder='auto'`` uses) by
    more than ``margin``; otherwise ``default``, so timing noise of a few percent never flips
    the advice. A ``default`` that was not measured gives the fastest.
    """
    if not ms:
        return default
    fastest = min(ms, key=ms.__getitem__)
    if default not in ms or ms[fastest] * (1 + margin) < ms[default]:
        return fastest
    return default


def _decoder_advice(advice: DecodeAdvice, auto: str, dataset: str) -> None:
    """Findings and one decoder recommendation that follow the measured times."""
    ms = advice.ms
    best = choose_decoder(ms, auto)
    timed = ", ".join(
        f"{NAMES.get(n, n)} {t:.2f} ms" for n, t in sorted(ms.items(), key=lambda x: x[1])
    )
    advice.findings.append(f"JPEG decode per sample: {timed}; decoder='auto' uses {auto}")
    auto_name, best_name = NAMES.get(auto, auto), NAMES.get(best, best)
    if best == auto:
        fastest = min(ms, key=ms.__getitem__)
        why = (
            "it is the fastest here"
            if fastest == auto
            else f"{NAMES.get(fastest, fastest)} is within {100 * MARGIN:.0f} % of it here"
        )
        advice.recommendations.append(f"decoder: keep decoder='auto' ({auto_name}): {why}")
        return
    advice.recommendations.append(
        f"decoder: {best_name} is fastest here, {ms[auto] / ms[best]:.2f}× the speed of"
        f" {auto_name} (what decoder='auto' uses): packer.open_dataset({dataset!r},"
        f" decoder={best!r})"
    )


def _decodes(data: bytes | memoryview) -> bool:
    try:
        decode(data, "numpy", "pillow")
    except (OSError, ValueError, SyntaxError):  # the doctor reports broken samples itself
        return False
    return True


def _time(samples: Sequence[bytes], name: str) -> float | None:
    """Milliseconds per sample of decoder ``name`` over ``samples`` (None: not installed)."""
    try:
        check_decoder(name)
    except PackerError:
        return None
    start = time.perf_counter()
    for data in samples:
        decode(data, "numpy", name)
    return 1e3 * (time.perf_counter() - start) / len(samples)


def _time_all(samples: Sequence[bytes], rounds: int = ROUNDS) -> dict[str, float]:
    """Each installed decoder's median over ``rounds`` interleaved passes (load spikes on a
    shared machine hit one pass of one decoder, not the median)."""
    names = ("pillow", *SPEED_ORDER)  # _time skips a decoder that is not installed
    passes: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name in names:
            ms = _time(samples, name)
            if ms is not None:
                passes.setdefault(name, []).append(ms)
    return {name: statistics.median(values) for name, values in passes.items()}


def decode_advice(
    samples: Sequence[bytes], source: str | None, dataset: str, kind: str = "image"
) -> DecodeAdvice:
    """Time the decoders on ``samples`` (encoded images) and advise.

    Args:
        samples: stored encoded images (or frames) of the dataset.
        source: the folder the dataset was converted from (for the resize command), if known.
        dataset: the dataset's path (for the ``decoder=`` line).
        kind: ``"image"`` or ``"video"`` (which option a resize command uses).
    """
    advice = DecodeAdvice()
    jpegs = [bytes(s) for s in samples if sniff(s) == "jpeg" and _decodes(s)]  # warms up, too
    if not jpegs:
        return advice
    advice.ms = _time_all(jpegs)
    infos = [i for i in (jpeg_info(d) for d in jpegs) if i is not None]
    if infos:
        advice.short_side = sum(min(i.width, i.height) for i in infos) / len(infos)
    auto = decoders_for("jpeg", "auto")[0].name
    if len(advice.ms) > 1:
        _decoder_advice(advice, auto, dataset)
    else:
        missing = "; ".join(f"{n}: {why}" for n, why in MISSING.items()) or "none installed"
        advice.recommendations.append(
            "decoder: pip install 'packer-datasets[fast]' (simplejpeg decodes ~1.2-2× faster "
            f"than Pillow, more on large photos); now: {missing}"
        )
    if advice.short_side is not None and advice.short_side > SHORT_SIDE * 1.15:
        gain = (advice.short_side / SHORT_SIDE) ** 2
        src = source or "SRC"
        dst = Path(dataset)
        command = (
            f"packer convert {src} {dst.with_name(dst.stem + f'-{SHORT_SIDE}' + (dst.suffix or '.lmdb'))}"
            f" --short-side {SHORT_SIDE}"
        )
        advice.recommendations.append(
            f"resize at write time: images average a {advice.short_side:.0f} px short side; "
            f"stored at {SHORT_SIDE} px they hold ~{gain:.1f}× fewer pixels to decode: {command} "
            "(fewer pixels are less detail: compare accuracy on your task before switching; "
            "FFCV and the ImageNet speed-runs store reduced-resolution copies for this reason)"
            + (" (frames: same option)" if kind == "video" else "")
        )
    return advice


def advise_dataset(dataset: Any, indices: Sequence[int], root: Path, fmt: str) -> DecodeAdvice:
    """:func:`decode_advice` for up to 24 of ``indices`` of a bytes-mode ``dataset`` at ``root``
    (format ``fmt``; ``"folder"`` for a plain folder, its own source)."""
    samples: list[bytes] = []
    kind = "image"
    for i in list(indices)[:24]:
        data = dataset[i][0]
        if isinstance(data, list):  # a clip: its first frame stands for the video's frames
            kind, data = "video", data[0]
        samples.append(data)
    source = str(root)
    if fmt != "folder":
        from packer.core.manifest import load_manifest

        try:
            source = str(load_manifest(root).source.get("root") or "SRC")
        except PackerError:
            source = "SRC"
    return decode_advice(samples, source, str(root), kind)
