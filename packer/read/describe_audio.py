"""What the audio fields of a packed dataset hold, for ``packer inspect``: clips, total duration,
sample rates and channels, from each clip's header (nothing decoded; ``verify --full`` decodes).

Every stored clip is read (its header parsed: a WAV's by ``wave``, any other by ffmpeg's
demuxer), a few hundred at a time; a clip whose container does not declare its duration is
counted apart, and so is one whose header does not parse (``verify --full`` says why).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from packer.core.fields import ABSENT
from packer.decode.audio import AudioError, probe_audio
from packer.read.store import Packed

__all__ = ["audio_lines", "audio_stats"]

_BATCH = 256  # clips read at once


def audio_stats(packed: Packed) -> list[dict[str, Any]]:
    """Per audio field: ``name``, ``clips``, ``seconds`` (the sum of the declared durations),
    ``longest``, ``sample_rates`` and ``channels`` (``{value: clips}``), ``unknown_duration``
    and ``unreadable`` (clips counted apart). [] for a dataset without audio fields."""
    out = []
    for j, spec in enumerate(packed.manifest.opts.fields):
        if spec.kind != "audio":
            continue
        records = packed.first + j
        present = ~((packed.reader.length[records] == 0) & (packed.checksums[records] == ABSENT))
        records = records[present]
        rates: Counter[int] = Counter()
        channels: Counter[int] = Counter()
        seconds, longest, unknown, unreadable = 0.0, 0.0, 0, 0
        for start in range(0, len(records), _BATCH):
            for data in packed.reader.read_many(records[start : start + _BATCH]):
                try:
                    info = probe_audio(data)
                except AudioError:
                    unreadable += 1
                    continue
                rates[info.sample_rate] += 1
                channels[info.channels] += 1
                if info.frames < 0 or not info.sample_rate:
                    unknown += 1
                    continue
                seconds += info.seconds
                longest = max(longest, info.seconds)
        out.append(
            {
                "name": spec.name,
                "clips": int(len(records)),
                "seconds": seconds,
                "longest": longest,
                "sample_rates": {str(k): v for k, v in sorted(rates.items())},
                "channels": {str(k): v for k, v in sorted(channels.items())},
                "unknown_duration": unknown,
                "unreadable": unreadable,
            }
        )
    return out


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def audio_lines(stats: list[dict[str, Any]]) -> list[str]:
    """The lines :func:`audio_stats` gives ``packer inspect``."""
    lines = []
    for s in stats:
        timed = s["clips"] - s["unknown_duration"] - s["unreadable"]
        mean = s["seconds"] / timed if timed else 0.0
        line = (
            f"audio field {s['name']!r}: {s['clips']} clips, {_duration(s['seconds'])} in all "
            f"(mean {mean:.2f} s, longest {s['longest']:.2f} s); sample rates: "
            + ", ".join(f"{r} Hz ({n})" for r, n in s["sample_rates"].items())
            + "; channels: "
            + ", ".join(f"{c} ({n})" for c, n in s["channels"].items())
        )
        if s["unknown_duration"]:
            line += f"; {s['unknown_duration']} of undeclared duration (not summed)"
        if s["unreadable"]:
            line += f"; {s['unreadable']} whose header does not parse (see verify --full)"
        lines.append(line)
    return lines
