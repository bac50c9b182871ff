"""PyTorch datasets of video clips over packed video outputs and plain frame folders.

Each item is ``(clip, label)``: ``num_frames`` frames picked by ``sampling`` (see
:mod:`packer.read.clip_frames`; short videos are padded by repeating frames in order), read (only those
frames; a repeated frame is read once) and decoded into ``output``:

- ``"pil"``: a list of RGB PIL images (for torchvision transforms),
- ``"numpy"``: a T×H×W×3 uint8 array, ``"tensor"``: a T×C×H×W uint8 torch tensor,
- ``"bytes"``: a list of the encoded frames (no decode).

``transform`` gets the whole clip. With ``seed`` set, ``random``/``segments`` clips are a
function of ``(seed, epoch, index)``: call :meth:`VideoDataset.set_epoch` each epoch (before the
DataLoader iterator is created: workers copy the dataset when they start, so with
``persistent_workers=True`` the epoch they see is the one set before the first epoch).

Readers hold only paths, numpy arrays and options; files open lazily in each process.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from packer.core.strings import StringTable
from packer.decode.outputs import decode
from packer.errors import InputFileError, PackerError
from packer.read.clip_frames import SAMPLINGS, clip_indices, clip_rng
from packer.read.dataset_base import PackedSamples, SampleDataset, Transform
from packer.read.options import ReadOptions, old_name
from packer.read.store import Packed, opened
from packer.source.videos import scan_videos

__all__ = [
    "BMPVideoDataset",
    "HDF5VideoDataset",
    "LMDBVideoDataset",
    "FolderVideoDataset",
    "NPYVideoDataset",
    "VideoDataset",
]


def stack_clip(frames: list[Any], output: str) -> Any:
    """Join decoded frames: numpy → T×H×W×3 array, tensor → T×C×H×W tensor, else a list."""
    if output == "numpy":
        return np.stack(frames)
    if output == "tensor":
        return torch.stack(frames)
    return frames


class VideoDataset(SampleDataset):
    """Clip sampling, decoding and transforms shared by every video dataset.

    Args:
        num_frames: frames per clip.
        sampling: ``"uniform"`` (deterministic, the default), ``"random"`` or ``"segments"``.
        stride: frame step of ``random`` windows.
        output: ``"pil"``, ``"numpy"``, ``"tensor"`` or ``"bytes"``.
        transform: applied to the whole clip; ``target_transform`` to the label.
        seed: make ``random``/``segments`` clips reproducible per (epoch, index).
        on_error: ``"raise"`` or ``"skip"`` (serve the next decodable video in place of one
            whose frames do not decode, counted in ``replaced``).
        decoder: the frames' decoder, ``"auto"`` or a name (see :mod:`packer.decode.registry`).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        classes: list[str],
        labels: np.ndarray,
        counts: np.ndarray,
        num_frames: int = 8,
        sampling: str = "uniform",
        stride: int = 1,
        output: str = "pil",
        transform: Transform = None,
        target_transform: Transform = None,
        seed: int | None = None,
        decoder: str = "auto",
        on_error: str = "raise",
    ) -> None:
        if sampling not in SAMPLINGS:
            raise PackerError(
                f"unknown sampling {sampling!r}; expected one of {', '.join(SAMPLINGS)}"
            )
        if num_frames < 1 or stride < 1:
            raise PackerError(f"num_frames and stride must be >= 1, got {num_frames} and {stride}")
        super().__init__(
            root, classes, labels, transform, target_transform, output, on_error, decoder
        )
        self.frame_counts = np.ascontiguousarray(counts, dtype=np.int64)
        self.num_frames, self.sampling, self.stride = num_frames, sampling, stride
        self.seed = seed
        self.epoch = 0

    UNIT = "videos"

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch that seeded sampling draws from (see the module docstring)."""
        self.epoch = int(epoch)

    def clip_indices(self, i: int) -> np.ndarray:
        """The frame numbers of item ``i``'s clip (sorted; repeats pad short videos)."""
        rng = None if self.sampling == "uniform" else clip_rng(self.seed, self.epoch, i)
        return clip_indices(
            int(self.frame_counts[i]), self.num_frames, self.sampling, rng, self.stride
        )

    def read_frames(self, i: int, frames: np.ndarray) -> list[bytes]:
        """The stored bytes of frames ``frames`` (distinct frame numbers) of video ``i``."""
        raise NotImplementedError

    def _describe(self, i: int) -> str:
        return f"video {i}"

    def read_clip(self, i: int) -> list[bytes]:
        """The encoded frames of item ``i``'s clip (each distinct frame read once)."""
        wanted = self.clip_indices(i)
        if len(wanted) < 2 or bool((wanted[1:] > wanted[:-1]).all()):  # the usual case
            return self.read_frames(i, wanted)
        distinct, where = np.unique(wanted, return_inverse=True)
        data = self.read_frames(i, distinct)
        return [data[j] for j in where.reshape(-1)]

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self._or_replacement(self._position(i), self._clip)

    def _clip(self, position: int) -> tuple[Any, Any]:
        encoded = self.read_clip(position)
        if self.output == "bytes" and self.transform is None:  # nothing to decode or copy
            return [f if type(f) is bytes else bytes(f) for f in encoded], self._label(position)
        try:
            frames = [decode(f, self.output, self.decoder) for f in encoded]
            clip = stack_clip(frames, self.output)
        except (OSError, ValueError, SyntaxError, RuntimeError) as exc:
            raise InputFileError(f"{self._describe(position)} cannot be decoded: {exc}") from exc
        if self.transform is not None:
            clip = self.transform(clip)
        return clip, self._label(position)

    def _repr_fields(self) -> str:
        return f"num_frames={self.num_frames}, sampling={self.sampling!r}"


class PackedVideoDataset(PackedSamples, VideoDataset):
    """Clips from a packer video output (format given by ``FORMAT``): a clip reads only its
    sampled frames' records (one ``getmulti`` for LMDB, ``pread`` of exactly their byte ranges
    for the per-video NPY and HDF5 files, adjacent frames in one read).

    The keyword-only options after the clip's are the read options,
    :class:`~packer.read.options.ReadOptions`.
    """

    FORMAT = ""

    def __init__(
        self,
        root: str | os.PathLike[str] | Packed,
        num_frames: int = 8,
        *,
        sampling: str = "uniform",
        stride: int = 1,
        output: str = "pil",
        transform: Transform = None,
        target_transform: Transform = None,
        seed: int | None = None,
        decoder: str = "auto",
        on_error: str = "raise",
        split: str | None = None,
        readahead: bool | None = None,
        max_open_files: int | None = None,
        storage_options: dict[str, Any] | None = None,
        cache: bool | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        cache_limit: int | str | None = None,
        check_records: bool = False,
    ) -> None:
        options = ReadOptions(
            split,
            readahead,
            max_open_files,
            storage_options,
            cache,
            cache_dir,
            cache_limit,
            check_records,
        )
        packed = opened(root, "video", self.FORMAT or None, options)
        root = packed.given
        options = packed.options
        super().__init__(
            root,
            packed.manifest.classes,
            packed.labels,
            packed.counts,
            num_frames,
            sampling,
            stride,
            output,
            transform,
            target_transform,
            seed,
            decoder,
            on_error,
        )
        self._attach(packed)
        self._opened_by(
            PackedVideoDataset,
            dict(
                root=root,
                num_frames=num_frames,
                sampling=sampling,
                stride=stride,
                output=output,
                transform=transform,
                target_transform=target_transform,
                seed=seed,
                decoder=decoder,
                on_error=on_error,
                **options.given(),
            ),
        )

    def read_frames(self, i: int, frames: np.ndarray) -> list[bytes]:
        return self.reader.read_many(int(self.first[i]) + np.asarray(frames, dtype=np.int64))


class NPYVideoDataset(PackedVideoDataset):
    """Clips from a packer ``.npy`` video output: only the sampled rows' true bytes are read."""

    FORMAT = "npy"


class HDF5VideoDataset(PackedVideoDataset):
    """Clips from a packer ``.h5`` video output (``max_open_files`` bounds open files)."""

    FORMAT = "hdf5"


class LMDBVideoDataset(PackedVideoDataset):
    """Clips from a packer ``.lmdb`` video output (one ``getmulti`` per clip)."""

    FORMAT = "lmdb"


class BMPVideoDataset(PackedVideoDataset):
    """Decoded clips from a packer ``.bmp`` video output (no decode cost)."""

    FORMAT = "bmp"


class FolderVideoDataset(VideoDataset):
    """Clips from a plain ``<class>/<video>/<frame>`` tree of JPEG frames (the baseline)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        num_frames: int = 8,
        *,
        sampling: str = "uniform",
        stride: int = 1,
        output: str = "pil",
        transform: Transform = None,
        target_transform: Transform = None,
        seed: int | None = None,
        decoder: str = "auto",
        on_error: str = "raise",
    ) -> None:
        source = scan_videos(root)
        videos = [v for v in source.videos if v.frames is not None]
        if not videos:
            raise PackerError(f"no frame folder in {str(root)!r} (video files need converting)")
        labels = np.array([v.label for v in videos], dtype=np.int64)
        counts = np.array([len(v.frames or ()) for v in videos], dtype=np.int64)
        super().__init__(
            root,
            source.classes,
            labels,
            counts,
            num_frames,
            sampling,
            stride,
            output,
            transform,
            target_transform,
            seed,
            decoder,
            on_error,
        )
        self.keys = StringTable(v.key for v in videos)
        self._first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        self._paths = StringTable(p for v in videos for p in v.frames or ())

    def read_frames(self, i: int, frames: np.ndarray) -> list[bytes]:
        out = []
        for j in frames:
            with open(self._paths[int(self._first[i] + j)], "rb") as fh:
                out.append(fh.read())
        return out


_CLASSES: dict[str, type[PackedVideoDataset]] = {
    cls.FORMAT: cls
    for cls in (NPYVideoDataset, HDF5VideoDataset, LMDBVideoDataset, BMPVideoDataset)
}


# The names before one scheme (<FORMAT>VideoDataset, Folder as a format): they still resolve,
# with a DeprecationWarning.
_OLD_NAMES = {"NpyVideoDataset": NPYVideoDataset, "VideoFolderDataset": FolderVideoDataset}


def __getattr__(name: str) -> Any:
    return old_name(__name__, _OLD_NAMES, name)
