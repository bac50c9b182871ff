"""Audio kind: clips stored as their files' bytes, checked at conversion, decoded on read.

- a class tree of clips (``<class>/<clip>.wav``) converts into samples of fields ``audio`` and
  ``label`` (:func:`scan_audio`); a field named ``wav``, ``flac``, ... (or ``audio``) of any
  source of samples with fields, or of :class:`packer.Writer`, is an audio field;
- :func:`decode_audio` gives ``(waveform, sample_rate)`` as ``torchaudio.load`` does (float32,
  channels × frames), after the :class:`AudioOptions` (resample, crop, mono) that
  :class:`packer.FieldDataset` also takes;
- :func:`check_audio` is the conversion's check; :func:`make_audio_tree` writes a small tree.

Names are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AudioError": "packer.decode.audio",
    "AudioInfo": "packer.decode.audio",
    "AudioOptions": "packer.decode.audio",
    "check_audio": "packer.decode.audio",
    "decode_audio": "packer.decode.audio",
    "scan_audio": "packer.source.audio",
    "encode_clip": "packer.demo.audio",
    "make_audio_tree": "packer.demo.audio",
    "wav_bytes": "packer.demo.audio",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'packer.audio' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
