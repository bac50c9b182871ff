"""The video part of a conversion: scan a video tree and load each video's frames as records.

Everything else (planning, the parallel pool, writers, checkpoints and ``--resume``, tables,
manifest, publication) is the pipeline every kind shares (``packer.convert``, ``packer.write.pipeline``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import Any

from packer.errors import PackerError
from packer.source.videos import VideoScan, scan_videos
from packer.write.options import ConvertOptions
from packer.write.pipeline import Prepared
from packer.write.video_load import FrameOptions, import_av, load_video

__all__ = ["VIDEO_OPTIONS", "prepare_video"]

VIDEO_OPTIONS = ("quality", "max_side", "short_side", "fps", "skip_bad_frames")


def _frame_options(options: ConvertOptions, transcode: Any) -> FrameOptions:
    unknown = ["reencode"] * options.resize.reencode + ["size"] * (options.size is not None)
    if unknown:
        raise PackerError(
            f"unknown option(s) {', '.join(unknown)}; video takes {', '.join(VIDEO_OPTIONS)}"
        )
    return FrameOptions(options.resize, options.video, options.check, transcode)


def _check_source(source: VideoScan, fps: float | None) -> None:
    files = [v for v in source.videos if v.is_file]
    if files:
        import_av()  # a clear "pip install packer-datasets[video]" before any work
    if fps is not None and len(files) < len(source.videos):
        folder = next(v for v in source.videos if not v.is_file)
        raise PackerError(
            f"--fps applies to video files only; {folder.path!r} is a frame folder with no "
            "frame rate: drop --fps or subsample the frames yourself"
        )


def prepare_video(src: Path, fmt: ModuleType, options: ConvertOptions) -> Prepared:
    """Validate the video options, scan ``src`` and return the pipeline's video part.

    Options: ``quality`` (JPEG quality of frames decoded from video files or resized, default
    90), ``max_side`` / ``short_side`` (resize frames, re-encoding them), ``fps`` (keep at most
    this many frames per second of a video file), ``skip_bad_frames`` (drop a bad frame and
    record it instead of skipping its whole video).
    """
    frame = _frame_options(options, fmt.TRANSCODE)
    source = scan_videos(src)
    _check_source(source, frame.video.fps)
    cpu_bound = frame.transcode is not None or frame.resize or any(v.is_file for v in source.videos)
    sizing, video = frame.sizing, frame.video
    recorded = {
        "quality": sizing.quality,
        "max_side": sizing.max_side,
        "short_side": sizing.short_side,
        "fps": video.fps,
        "skip_bad_frames": video.skip_bad_frames,
        "check": options.check,
    }
    loader = functools.partial(load_video, options=frame)
    return Prepared(source, loader, cpu_bound, recorded, "video")
