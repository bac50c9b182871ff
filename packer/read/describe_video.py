"""Describe a packed video dataset for ``packer inspect``: returns text, never prints."""

from __future__ import annotations

import os
from pathlib import Path

from packer.core.sizes import format_size
from packer.read.store import open_packed

__all__ = ["describe_video"]


def describe_video(path: str | os.PathLike[str]) -> str:
    """Videos, frames, mean/max frames per video, bytes of frames and padding overhead.

    Meant to follow :func:`packer.read.describe.describe` for a manifest whose ``kind`` is ``"video"``.
    """
    packed = open_packed(Path(path), kind="video", check_files=False)  # tables checked
    manifest, counts = packed.manifest, packed.counts
    storage, opts = manifest.opts.storage, manifest.opts
    lines = [
        f"videos: {len(counts)}    frames: {int(counts.sum())}    frames per video: "
        f"mean {float(counts.mean()) if len(counts) else 0.0:.1f}, "
        f"min {int(counts.min()) if len(counts) else 0}, max {int(counts.max()) if len(counts) else 0}",
        f"frame bytes: {format_size(storage.get('frame_bytes', 0))}    on disk: "
        f"{format_size(storage.get('data_bytes', 0))}    padding overhead: "
        f"{storage.get('padding_overhead', 1.0):.3f}× (bytes on disk / bytes of frames)",
    ]
    encoded = bool(manifest.source.get("video_files") or opts.max_side or opts.short_side)
    frame_options = [
        f"{name}={value}"
        for name, value in [
            ("max_side", opts.max_side),
            ("short_side", opts.short_side),
            ("fps", opts.fps),
            ("skip_bad_frames", opts.skip_bad_frames),
        ]
        if value not in (None, False)
    ]
    if encoded:  # quality only means something for frames packer encoded
        frame_options.insert(0, f"quality={90 if opts.quality is None else opts.quality}")
    if not manifest.source.get("video_files") and not frame_options:
        lines.append("frames: stored as found in the frame folders (not re-encoded)")
    elif encoded:
        lines.append(
            "frames: JPEG-encoded by packer where decoded from a video file or shrunk, others "
            "stored as found (" + ", ".join(frame_options) + ")"
        )
    else:
        lines.append("frames: stored as found (" + ", ".join(frame_options) + ")")
    return "\n".join(lines)
