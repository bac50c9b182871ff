"""When decode is the bottleneck: which decoder, and which write-time resize, and what they save.

``packer doctor`` calls :func:`decode_advice` with a few stored samples of the dataset. It times
each installed decoder on them (same bytes, same process), reads their sizes from the headers,
and returns findings and recommendations with the command line to type: a faster decoder
(``decoder=``, or ``pip install packer-datasets[fast]``), and for images larger than 256 px on
the short side, a conversion with ``--short-side 256`` (decode cost scales with pixels).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.decode import decode
from packer.decoders import check_decoder, decoders_for, sniff
from packer.errors import PackerError
from packer.fast_decoders import MISSING, SPEED_ORDER, jpeg_info

__all__ = ["DecodeAdvice", "decode_advice"]

SHORT_SIDE = 256  # what the recipe stores: FFCV's and the speed-runs' training resolution


@dataclass
class DecodeAdvice:
    """Per-decoder decode time (ms per sample) and what to do about it."""

    ms: dict[str, float] = field(default_factory=dict)
    short_side: float | None = None  # mean short side of the sampled JPEGs
    findings: list[str] = field(default_factory=list)
    recommendations: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"decode_ms": self.ms, "mean_short_side": self.short_side}


def _decodes(data: bytes | memoryview) -> bool:
    try:
        decode(data, "numpy", "pillow")
    except (OSError, ValueError, SyntaxError):  # the doctor reports broken samples itself
        return False
    return True


def _time(samples: Sequence[bytes], name: str) -> float | None:
    try:
        check_decoder(name)
    except PackerError:
        return None
    start = time.perf_counter()
    for data in samples:
        decode(data, "numpy", name)
    return 1e3 * (time.perf_counter() - start) / len(samples)


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
    for name in ("pillow", *SPEED_ORDER):  # _time skips a decoder that is not installed
        ms = _time(jpegs, name)
        if ms is not None:
            advice.ms[name] = ms
    infos = [i for i in (jpeg_info(d) for d in jpegs) if i is not None]
    if infos:
        advice.short_side = sum(min(i.width, i.height) for i in infos) / len(infos)
    pillow = advice.ms["pillow"]
    fast = {n: ms for n, ms in advice.ms.items() if n != "pillow"}
    if fast:
        best = min(fast, key=fast.__getitem__)
        auto = decoders_for("jpeg", "auto")[0].name
        advice.findings.append(
            f"JPEG decode per sample: Pillow {pillow:.2f} ms, {best} {fast[best]:.2f} ms "
            f"({pillow / fast[best]:.2f}×); decoder='auto' uses {auto}"
        )
        advice.recommendations.append(
            f"decoder: packer.open_dataset({dataset!r}, decoder={best!r}) (or 'auto', the "
            "default) decodes with the fastest installed library"
        )
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
        from packer.manifest import load_manifest

        try:
            source = str(load_manifest(root).source.get("root") or "SRC")
        except PackerError:
            source = "SRC"
    return decode_advice(samples, source, str(root), kind)
