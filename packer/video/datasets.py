"""PyTorch datasets of video clips over packed video outputs and plain frame folders.

Each item is ``(clip, label)``: ``num_frames`` frames picked by ``sampling`` (see
:mod:`packer.sampling`; short videos are padded by repeating frames in order), read (only those
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from packer.decode import check_output, decode
from packer.errors import FormatError, InputFileError, PackerError
from packer.formats.common import check_shard_files
from packer.manifest import MANIFEST_NAME, load_index, load_manifest
from packer.sampling import SAMPLINGS, clip_indices, clip_rng
from packer.strings import StringTable
from packer.video.formats import video_format
from packer.video.layout import load_frames
from packer.video.sources import scan_videos

__all__ = [
    "BMPVideoDataset",
    "HDF5VideoDataset",
    "LMDBVideoDataset",
    "NpyVideoDataset",
    "VideoDataset",
    "VideoFolderDataset",
    "open_video_dataset",
]

Transform = Callable[[Any], Any] | None


def stack_clip(frames: list[Any], output: str) -> Any:
    """Join decoded frames: numpy → T×H×W×3 array, tensor → T×C×H×W tensor, else a list."""
    if output == "numpy":
        return np.stack(frames)
    if output == "tensor":
        return torch.stack(frames)
    return frames


class VideoDataset(Dataset):
    """Clip sampling, decoding and transforms shared by every video dataset.

    Args:
        num_frames: frames per clip.
        sampling: ``"uniform"`` (deterministic, the default), ``"random"`` or ``"segments"``.
        stride: frame step of ``random`` windows.
        output: ``"pil"``, ``"numpy"``, ``"tensor"`` or ``"bytes"``.
        transform: applied to the whole clip; ``target_transform`` to the label.
        seed: make ``random``/``segments`` clips reproducible per (epoch, index).
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
    ) -> None:
        if sampling not in SAMPLINGS:
            raise PackerError(
                f"unknown sampling {sampling!r}; expected one of {', '.join(SAMPLINGS)}"
            )
        if num_frames < 1 or stride < 1:
            raise PackerError(f"num_frames and stride must be >= 1, got {num_frames} and {stride}")
        self.root = Path(root)
        self.classes = list(classes)
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        self.targets = np.ascontiguousarray(labels, dtype=np.int64)
        self.frame_counts = np.ascontiguousarray(counts, dtype=np.int64)
        self.num_frames, self.sampling, self.stride = num_frames, sampling, stride
        self.output = check_output(output)
        self.transform, self.target_transform = transform, target_transform
        self.seed = seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.targets)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch that seeded sampling draws from (see the module docstring)."""
        self.epoch = int(epoch)

    def clip_indices(self, i: int) -> np.ndarray:
        """The frame numbers of item ``i``'s clip (sorted; repeats pad short videos)."""
        rng = None if self.sampling == "uniform" else clip_rng(self.seed, self.epoch, i)
        return clip_indices(
            int(self.frame_counts[i]), self.num_frames, self.sampling, rng, self.stride
        )

    def _read_frames(self, i: int, frames: np.ndarray) -> list[bytes]:
        raise NotImplementedError

    def _describe(self, i: int) -> str:
        return f"video {i}"

    def _position(self, i: int) -> int:
        n = len(self)
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"dataset indices must be integers, not {type(i).__name__}")
        if not -n <= i < n:
            raise IndexError(f"index {i} out of range for a dataset of {n} videos")
        return int(i) % n

    def read_clip(self, i: int) -> list[bytes]:
        """The encoded frames of item ``i``'s clip (each distinct frame read once)."""
        wanted = self.clip_indices(i)
        distinct, where = np.unique(wanted, return_inverse=True)
        data = self._read_frames(i, distinct)
        return [data[j] for j in where.reshape(-1)]

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        position = self._position(i)
        encoded = self.read_clip(position)
        try:
            frames = [decode(f, self.output) for f in encoded]
            clip = stack_clip(frames, self.output)
        except (OSError, ValueError, SyntaxError, RuntimeError) as exc:
            raise InputFileError(f"{self._describe(position)} cannot be decoded: {exc}") from exc
        if self.transform is not None:
            clip = self.transform(clip)
        label: Any = int(self.targets[position])
        if self.target_transform is not None:
            label = self.target_transform(label)
        return clip, label

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({str(self.root)!r}, videos={len(self)}, "
            f"num_frames={self.num_frames}, sampling={self.sampling!r}, output={self.output!r})"
        )


class PackedVideoDataset(VideoDataset):
    """Clips from a packer video output (format given by ``FORMAT``).

    Reader options (``max_open_files`` for NPY/HDF5, ``readahead`` for LMDB) pass through.
    """

    FORMAT = ""

    def __init__(self, root: str | os.PathLike[str], num_frames: int = 8, **kwargs: Any) -> None:
        manifest = load_manifest(root)
        if self.FORMAT and manifest.format != self.FORMAT:
            raise FormatError(
                f"{str(root)!r} holds format {manifest.format!r}, not {self.FORMAT!r}; "
                "use packer.video.open_video_dataset() to pick the right class"
            )
        if manifest.kind != "video":
            raise FormatError(f"{str(root)!r} holds {manifest.kind!r} samples, not videos")
        index = load_index(root, manifest)
        frames = load_frames(root, manifest, index)
        check_shard_files(Path(root), manifest)
        names = ("sampling", "stride", "output", "transform", "target_transform", "seed")
        common = {k: kwargs.pop(k) for k in names if k in kwargs}
        super().__init__(
            root, manifest.classes, index["label"], index["length"], num_frames, **common
        )
        self.manifest = manifest
        self.reader = video_format(manifest.format).Reader(
            root, manifest, index, frames["length"], **kwargs
        )

    @property
    def keys(self) -> StringTable:
        """Each video's key (``<class>/<video>``)."""
        return self.reader.keys

    def _describe(self, i: int) -> str:
        return f"video {i} ({self.keys[i]!r} in {str(self.root)!r})"

    def _read_frames(self, i: int, frames: np.ndarray) -> list[bytes]:
        return self.reader.read(i, frames)


class NpyVideoDataset(PackedVideoDataset):
    """Clips from a packer ``.npy`` video output: memory-mapped, only sampled rows read."""

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


class VideoFolderDataset(VideoDataset):
    """Clips from a plain ``<class>/<video>/<frame>`` tree of JPEG frames (the baseline)."""

    def __init__(self, root: str | os.PathLike[str], num_frames: int = 8, **kwargs: Any) -> None:
        source = scan_videos(root)
        videos = [v for v in source.videos if v.frames is not None]
        if not videos:
            raise PackerError(f"no frame folder in {str(root)!r} (video files need converting)")
        labels = np.array([v.label for v in videos], dtype=np.int64)
        counts = np.array([len(v.frames or ()) for v in videos], dtype=np.int64)
        super().__init__(root, source.classes, labels, counts, num_frames, **kwargs)
        self.keys = StringTable(v.key for v in videos)
        self._first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        self._paths = StringTable(p for v in videos for p in v.frames or ())

    def _read_frames(self, i: int, frames: np.ndarray) -> list[bytes]:
        out = []
        for j in frames:
            with open(self._paths[int(self._first[i] + j)], "rb") as fh:
                out.append(fh.read())
        return out


_CLASSES: dict[str, type[PackedVideoDataset]] = {
    cls.FORMAT: cls
    for cls in (NpyVideoDataset, HDF5VideoDataset, LMDBVideoDataset, BMPVideoDataset)
}


def open_video_dataset(root: str | os.PathLike[str], **kwargs: Any) -> VideoDataset:
    """Open a packer video output (format from its manifest) or a plain frame-folder tree.

    Keyword arguments go to the dataset class (``num_frames``, ``sampling``, ``output``, ...).
    """
    path = Path(root)
    if (path / MANIFEST_NAME).is_file():
        return _CLASSES[load_manifest(path).format](path, **kwargs)
    return VideoFolderDataset(path, **kwargs)
