"""Convert a video tree into a packed video dataset: scan → parallel load → writer → manifest.

Same contract as :func:`packer.convert.convert`: the output is built in ``DST.partial/`` and
renamed once complete, the manifest is written last, videos are written in scan order (so the
bytes do not depend on ``workers``), bad inputs are skipped and recorded (``strict`` makes them
fatal). The layout is described in :mod:`packer.video.layout`.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import xxhash
from tqdm.auto import tqdm

from packer.convert import DEFAULT_SHARD_SIZE, ConvertResult, check_destination, publish
from packer.errors import DestinationError, InputFileError, PackerError
from packer.formats import format_for
from packer.manifest import (
    INDEX_DTYPE,
    INDEX_NAME,
    KEYS_NAME,
    Manifest,
    bytes_checksum,
    write_index,
    write_keys,
    write_manifest,
)
from packer.pipeline import default_workers
from packer.sizes import format_size, parse_size
from packer.sources import SkippedInput
from packer.video.formats import video_format
from packer.video.layout import FRAME_DTYPE, FRAMES_NAME, LAYOUT_VERSION, write_frames
from packer.video.load import FrameOptions, import_av, load_in_order
from packer.video.sources import VideoScan, scan_videos

__all__ = ["VideoConvertResult", "convert_video"]


@dataclass
class VideoConvertResult(ConvertResult):
    """A :class:`packer.convert.ConvertResult` whose summary adds frames and padding overhead."""

    def summary(self) -> str:
        """Counts, sizes, time, frames per video, padding overhead, skipped inputs."""
        lines = super().summary().split("\n")
        storage = self.manifest.options.get("storage", {})
        lines.insert(
            2,
            f"frames: {storage.get('frames', 0)} (mean {storage.get('mean_frames', 0):.1f}, "
            f"max {storage.get('max_frames', 0)} per video); padding overhead "
            f"{storage.get('padding_overhead', 1.0):.3f}× (bytes on disk / bytes of frames)",
        )
        return "\n".join(lines)


def _validate(
    fmt_name: str | None,
    dst: Path,
    workers: int | None,
    quality: int,
    sizes: dict[str, Any],
) -> ModuleType:
    module = video_format(fmt_name if fmt_name else format_for(dst).NAME)
    if workers is not None and workers < 1:
        raise PackerError(f"invalid workers {workers}; expected 1 or more")
    if not 1 <= quality <= 100:
        raise PackerError(f"invalid quality {quality}; expected 1..100 (JPEG quality)")
    for name in ("max_side", "short_side", "fps"):
        value = sizes[name]
        if value is not None and value <= 0:
            raise PackerError(
                f"invalid {name.replace('_', '-')} {value}; expected a positive number"
            )
    if sizes["max_side"] is not None and sizes["short_side"] is not None:
        raise PackerError("--max-side and --short-side are exclusive; pass one of them")
    return module


def _check_source(source: VideoScan, fps: float | None) -> None:
    files = [v for v in source.videos if v.is_file]
    if files:
        import_av()  # a clear "pip install packer[video]" before any work
    if fps is not None and len(files) < len(source.videos):
        folder = next(v for v in source.videos if not v.is_file)
        raise PackerError(
            f"--fps applies to video files only; {folder.path!r} is a frame folder with no "
            "frame rate: drop --fps or subsample the frames yourself"
        )


class _Rows:
    """Index rows, frame rows and keys gathered while writing."""

    def __init__(self) -> None:
        self.videos: list[tuple[int, int, int, int, int]] = []
        self.frames: list[tuple[int, int]] = []
        self.keys: list[str] = []

    def add(self, key: str, label: int, shard: int, frames: list[bytes]) -> None:
        digest = xxhash.xxh3_64()
        for frame in frames:
            digest.update(frame)
        self.videos.append((label, shard, len(self.frames), len(frames), digest.intdigest()))
        self.frames += [(len(f), bytes_checksum(f)) for f in frames]
        self.keys.append(key)


def _record_bad(skipped: list[SkippedInput], path: str, reason: str, strict: bool) -> None:
    skipped.append(SkippedInput(path, reason))
    if strict:
        raise InputFileError(f"{path}: {reason} (--strict)")


def _write_videos(
    module: ModuleType,
    partial: Path,
    source: VideoScan,
    shard_size: int,
    workers: int,
    strict: bool,
    options: FrameOptions,
    progress: bool,
) -> tuple[_Rows, list[SkippedInput], Any]:
    skipped = list(source.skipped)
    if strict and skipped:
        raise InputFileError(f"{skipped[0].path}: {skipped[0].reason} (--strict)")
    rows = _Rows()
    cpu_bound = (
        options.transcode is not None or options.resize or any(v.is_file for v in source.videos)
    )
    loaded_iter = load_in_order(source.videos, options, workers, cpu_bound)
    bar = tqdm(
        total=len(source.videos),
        unit="video",
        desc=f"convert → {module.NAME}",
        disable=not progress,
    )
    with module.Writer(partial, shard_size) as writer:
        for sample, loaded in zip(source.videos, loaded_iter):
            for path, reason in loaded.dropped:
                _record_bad(skipped, path, f"frame dropped: {reason}", strict)
            if loaded.frames is None:
                _record_bad(skipped, sample.path, loaded.reason or "unknown", strict)
            else:
                shard = writer.write(sample.key, sample.label, loaded.frames)
                rows.add(sample.key, sample.label, shard, loaded.frames)
            bar.update(1)
        shards = writer.close()
    bar.close()
    if not rows.videos:
        raise PackerError(
            f"no usable video in {source.root!r}: all {len(source.videos)} inputs were skipped"
        )
    return rows, skipped, (shards, writer.data_bytes)


def _manifest(
    module: ModuleType,
    partial: Path,
    source: VideoScan,
    rows: _Rows,
    written: Any,
    options: dict,
    skipped: list[SkippedInput],
) -> Manifest:
    shards, data_bytes = written
    index = np.array(rows.videos, dtype=INDEX_DTYPE)
    frames = np.array(rows.frames, dtype=FRAME_DTYPE)
    files = {
        INDEX_NAME: write_index(partial, index),
        FRAMES_NAME: write_frames(partial, frames),
        KEYS_NAME: write_keys(partial, rows.keys),
    }
    frame_bytes = int(frames["length"].sum())
    options["storage"] = {
        "frames": len(frames),
        "frame_bytes": frame_bytes,
        "data_bytes": int(data_bytes),
        "padding_overhead": round(data_bytes / frame_bytes, 4) if frame_bytes else 1.0,
        "max_frames": int(index["length"].max()),
        "mean_frames": round(float(index["length"].mean()), 2),
    }
    num_files = sum(1 for v in source.videos if v.is_file)
    return Manifest(
        format=module.NAME,
        kind="video",
        num_samples=len(index),
        classes=source.classes,
        shards=shards,
        skipped=[{"path": s.path, "reason": s.reason} for s in skipped],
        source={
            "root": source.root,
            "files": source.num_files,
            "bytes": source.total_bytes,
            "videos": len(source.videos),
            "video_files": num_files,
            "frame_folders": len(source.videos) - num_files,
        },
        options=options,
        files=files,
        layout_version=LAYOUT_VERSION,
    )


def convert_video(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    *,
    format: str | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    workers: int | None = None,
    overwrite: bool = False,
    strict: bool = False,
    progress: bool = True,
    quality: int = 90,
    max_side: int | None = None,
    short_side: int | None = None,
    fps: float | None = None,
    skip_bad_frames: bool = False,
) -> ConvertResult:
    """Convert the video tree ``src`` (``<class>/<video>/<frame>`` or ``<class>/<video>.mp4``).

    Args:
        src: the source folder (frame folders and/or .mp4 .avi .webm .mkv files).
        dst: the destination; its suffix (.lmdb .h5 .hdf5 .npy .bmp) picks the format.
        format: force a format by name (``lmdb``, ``hdf5``, ``npy``, ``bmp``).
        shard_size: LMDB shards roll past this many bytes, at a video boundary.
        workers: parallel loaders (default: CPU count). The output does not depend on it.
        overwrite: replace an existing ``dst`` (only once the new one is complete).
        strict: make a bad frame or video fatal instead of skipping and recording it.
        progress: show a tqdm progress bar.
        quality: JPEG quality of frames decoded from video files or resized.
        max_side: shrink frames so the longer side is at most this (re-encodes frames).
        short_side: resize frames so the shorter side is this (re-encodes frames).
        fps: keep at most this many frames per second of a video file.
        skip_bad_frames: drop (and record) a bad frame instead of skipping its whole video.

    Raises:
        PackerError: bad arguments, source or destination; PyAV missing for video files; with
            ``strict``, a bad input.
    """
    src_path, dst_path = Path(src), Path(os.fspath(dst).rstrip("/") or "/")
    sizes = {"max_side": max_side, "short_side": short_side, "fps": fps}
    module = _validate(format, dst_path, workers, quality, sizes)
    size = parse_size(shard_size)
    check_destination(dst_path, overwrite)
    source = scan_videos(src_path)
    _check_source(source, fps)
    frame_options = FrameOptions(
        quality, max_side, short_side, fps, skip_bad_frames, module.TRANSCODE
    )
    options = {"shard_size": size, "quality": quality, **sizes, "skip_bad_frames": skip_bad_frames}
    partial = dst_path.with_name(dst_path.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir()
    start = time.perf_counter()
    try:
        rows, skipped, written = _write_videos(
            module,
            partial,
            source,
            size,
            workers or default_workers(),
            strict,
            frame_options,
            progress,
        )
        manifest = _manifest(module, partial, source, rows, written, options, skipped)
        write_manifest(partial, manifest)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            free = shutil.disk_usage(partial.parent).free
            raise DestinationError(
                f"disk full while writing {str(partial)!r}: {format_size(free)} free; "
                "free space and convert again"
            ) from exc
        raise DestinationError(f"writing {str(partial)!r} failed: {exc}") from exc
    publish(partial, dst_path)
    return VideoConvertResult(
        dst=dst_path,
        manifest=manifest,
        seconds=time.perf_counter() - start,
        bytes_in=source.total_bytes,
        bytes_out=sum(f.stat().st_size for f in dst_path.rglob("*") if f.is_file()),
        skipped=skipped,
    )
