"""Load one source video into its list of encoded frames (its records).

Frame folders: every frame is read and checked (:func:`packer.decode.check.check_image`); the bytes are
kept unchanged unless a resize shrinks the frame (:mod:`packer.decode.resize`, the images' rules). Video files:
decoded once with PyAV (optional dependency), subsampled to ``fps`` if asked, resized, and
encoded as JPEG at ``quality``. A ``transcode`` (BMP) then applies to every frame. Problems are
returned as reasons, never raised, so one bad video does not stop a conversion. The parallel,
ordered pool is :func:`packer.write.loading.load_in_order`, shared with images.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packer.decode.check import check_image, image_errors
from packer.decode.resize import Resize
from packer.errors import InputFileError, PackerError
from packer.source.videos import VideoSample
from packer.write.loading import Loaded, read_input
from packer.write.options import VideoOptions

__all__ = ["FrameOptions", "import_av", "load_video"]

_PYAV_HINT = (
    'reading video files needs PyAV: pip install "packer-datasets[video]"  (or: pip install av)'
)


def import_av() -> Any:
    """Import PyAV, or raise a PackerError naming ``pip install packer-datasets[video]``."""
    try:
        import av
    except ImportError as exc:
        raise PackerError(_PYAV_HINT) from exc
    return av


@dataclass(frozen=True)
class FrameOptions:
    """How frames are produced from a source video: the conversion's ``sizing`` and ``video``
    options, the image ``check`` of frames read from frame folders, and a ``transcode``."""

    sizing: Resize = field(default_factory=Resize)
    video: VideoOptions = field(default_factory=VideoOptions)
    check: str = "scan"  # packer.decode.check's level for frames read from frame folders
    transcode: Callable[[bytes], bytes] | None = None

    @property
    def resize(self) -> bool:
        """Whether frames may be resized (and so re-encoded)."""
        return self.sizing.max_side is not None or self.sizing.short_side is not None


def _load_folder(sample: VideoSample, options: FrameOptions) -> Loaded:
    frames: list[bytes] = []
    dropped: list[tuple[str, str]] = []
    for path in sample.frames or ():
        try:  # each raises InputFileError, whatever went wrong with the frame's bytes
            data = read_input(path)
            check_image(data, options.check)
            if options.resize:
                data = options.sizing.apply(data)
        except InputFileError as exc:
            reason = str(exc)
            if not options.video.skip_bad_frames:
                return Loaded(None, f"frame {path!r}: {reason}")
            dropped.append((path, reason))
            continue
        frames.append(data)
    if not frames:
        return Loaded(None, "no usable frame (all were dropped)", dropped)
    return Loaded(frames, None, dropped)


class _FpsFilter:
    """Keep the first frame at or after each tick of a ``fps`` clock started at the first frame."""

    def __init__(self, fps: float | None) -> None:
        self.step = 1.0 / fps if fps else 0.0
        self.next: float | None = None

    def keep(self, t: float) -> bool:
        if not self.step:
            return True
        if self.next is None:
            self.next = t
        if t + 1e-6 < self.next:
            return False
        while self.next <= t + 1e-6:
            self.next += self.step
        return True


def decode_video_file(path: str, options: FrameOptions) -> list[bytes]:
    """Decode every frame of the first video stream of ``path`` into JPEG bytes.

    Raises:
        InputFileError: PyAV cannot open or decode it, or it has no video stream or no frame.
        PackerError: PyAV is not installed.
    """
    av = import_av()
    frames: list[bytes] = []
    with image_errors("PyAV cannot decode it"):  # any other exception, named by its type
        _decode_into(frames, av, path, options)
    if not frames:
        raise InputFileError("no frame decoded")
    return frames


def _decode_into(frames: list[bytes], av: Any, path: str, options: FrameOptions) -> None:
    try:
        with av.open(path) as container:
            stream = next((s for s in container.streams if s.type == "video"), None)
            if stream is None:
                raise InputFileError("no video stream")
            rate = float(stream.average_rate or stream.guessed_rate or 25)
            clock = _FpsFilter(options.video.fps)
            for number, frame in enumerate(container.decode(stream)):
                t = frame.time if frame.time is not None else number / rate
                if clock.keep(float(t)):
                    frames.append(options.sizing.encode(frame.to_image()))
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise InputFileError(f"PyAV cannot decode it: {exc}") from exc


def load_video(sample: VideoSample, options: FrameOptions) -> Loaded:
    """Load one video's frames; a problem becomes ``Loaded(None, reason=...)``."""
    if sample.frames is None:
        try:
            loaded = Loaded(decode_video_file(sample.path, options))
        except InputFileError as exc:
            return Loaded(None, str(exc))
    else:
        loaded = _load_folder(sample, options)
    if loaded.records is not None and options.transcode is not None:
        try:
            return Loaded([options.transcode(f) for f in loaded.records], None, loaded.dropped)
        except InputFileError as exc:  # an ImageError: the transcodes raise nothing else
            return Loaded(None, f"cannot decode a frame: {exc}", loaded.dropped)
    return loaded
