"""Generate small video trees (JPEG frame folders and video files) for the demo, tests, benchmarks.

A video is a camera pan over one photo-like picture (:func:`packer.demo.image.photo_like`): frame ``j``
is a window shifted by ``j`` pixels, so consecutive frames differ a little, as in real video.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from packer.demo.image import DemoRow, convert_each, photo_like, time_targets

__all__ = ["VideoTree", "make_video_files", "make_video_tree", "pan_frames", "run_video_demo"]


@dataclass
class VideoTree:
    """What the generators wrote: the root, classes, the good videos (path -> frame count), extras."""

    root: Path
    classes: list[str]
    videos: dict[Path, int]
    bad: list[Path] = field(default_factory=list)
    empty: list[Path] = field(default_factory=list)


def pan_frames(rng: np.random.Generator, frames: int, size: tuple[int, int]) -> list[Image.Image]:
    """``frames`` RGB images of ``size`` (width, height) panning across one photo-like picture."""
    width, height = size
    picture = np.asarray(photo_like(rng, width + frames, height + frames // 2 + 1))
    return [
        Image.fromarray(
            np.ascontiguousarray(picture[j // 2 : j // 2 + height, j : j + width]), "RGB"
        )
        for j in range(frames)
    ]


def _frame_counts(rng: np.random.Generator, frames: tuple[int, int]) -> int:
    return int(rng.integers(frames[0], frames[1] + 1))


def make_video_tree(
    root: str | os.PathLike[str],
    classes: int = 2,
    per_class: int = 2,
    frames: tuple[int, int] = (5, 12),
    size: tuple[int, int] = (64, 48),
    quality: int = 90,
    bad: int = 0,
    empty: int = 0,
    seed: int = 0,
) -> VideoTree:
    """Write ``root/class_XX/video_XXX/img_N.jpg`` frame folders (natural order ``img_2 < img_10``).

    Args:
        root: folder to create (may exist).
        classes: class folders.
        per_class: good videos per class.
        frames: (min, max) frames per video.
        size: (width, height) of every frame.
        quality: JPEG quality.
        bad: extra videos whose middle frame is a truncated JPEG.
        empty: extra video folders with no frame.
        seed: the same seed writes the same bytes.
    """
    rng = np.random.default_rng(seed)
    root_path = Path(root)
    names = [f"class_{c:02d}" for c in range(classes)]
    tree = VideoTree(root_path, names, {})
    for c, name in enumerate(names):
        for v in range(per_class + (bad + classes - 1 - c) // classes):
            folder = root_path / name / f"video_{v:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            images = pan_frames(rng, _frame_counts(rng, frames), size)
            for j, image in enumerate(images):
                image.save(folder / f"img_{j + 1}.jpg", format="JPEG", quality=quality)
            if v < per_class:
                tree.videos[folder] = len(images)
            else:
                broken = folder / f"img_{len(images) // 2 + 1}.jpg"
                broken.write_bytes(broken.read_bytes()[: broken.stat().st_size // 2])
                tree.bad.append(folder)
    for e in range(empty):
        folder = root_path / names[e % classes] / f"empty_{e:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        tree.empty.append(folder)
    return tree


def write_video(
    path: str | os.PathLike[str],
    images: Sequence[Image.Image],
    rate: int = 25,
    codec: str | None = None,
    gop: int | None = None,
) -> None:
    """Encode ``images`` into a video file with PyAV.

    Args:
        path: the file to write; its suffix picks the container.
        images: the frames, all of one size (even width and height).
        rate: frames per second.
        codec: encoder name (default: MPEG-4 part 2, or VP8 for .webm).
        gop: keyframe interval in frames (default: the encoder's).
    """
    from packer.write.video_load import import_av

    av = import_av()
    if codec is None:
        codec = "libvpx" if str(path).endswith(".webm") else "mpeg4"
    with av.open(str(path), mode="w") as container:
        stream: Any = container.add_stream(codec, rate=rate)
        stream.width, stream.height = images[0].size
        stream.pix_fmt = "yuv420p"
        stream.bit_rate = 2_000_000
        if gop is not None:
            stream.codec_context.gop_size = gop
        for image in images:
            for packet in stream.encode(av.VideoFrame.from_image(image)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def make_video_files(
    root: str | os.PathLike[str],
    classes: int = 2,
    per_class: int = 2,
    frames: tuple[int, int] = (5, 12),
    size: tuple[int, int] = (64, 48),
    suffix: str = ".mp4",
    bad: int = 0,
    seed: int = 0,
    rate: int = 25,
) -> VideoTree:
    """Write ``root/class_XX/video_XXX.mp4`` (PyAV encodes them), plus ``bad`` garbage files."""
    rng = np.random.default_rng(seed)
    root_path = Path(root)
    names = [f"class_{c:02d}" for c in range(classes)]
    tree = VideoTree(root_path, names, {})
    for name in names:
        (root_path / name).mkdir(parents=True, exist_ok=True)
        for v in range(per_class):
            path = root_path / name / f"video_{v:03d}{suffix}"
            images = pan_frames(rng, _frame_counts(rng, frames), size)
            write_video(path, images, rate)
            tree.videos[path] = len(images)
    for b in range(bad):
        path = root_path / names[b % classes] / f"broken_{b:03d}{suffix}"
        path.write_bytes(b"not a video at all" * 64)
        tree.bad.append(path)
    return tree


def run_video_demo(
    workdir: str | os.PathLike[str],
    classes: int = 4,
    per_class: int = 8,
    frames: tuple[int, int] = (48, 96),
    size: tuple[int, int] = (320, 240),
    num_frames: int = 8,
    repeats: int = 3,
    progress: bool = True,
) -> tuple[VideoTree, list[Any], list[DemoRow]]:
    """Generate frame folders, convert them to every format, and time reading 8-frame clips.

    Returns the tree, each conversion's result and one :class:`packer.demo.image.DemoRow` per dataset
    (the JPEG frame folder first) whose ``bytes_per_s``/``decoded_per_s`` are **clips** per
    second (``output="bytes"`` / ``"numpy"``, ``num_workers=0``, batch 16, median of ``repeats``).
    """
    from torch.utils.data import Subset

    from packer.read.open import open_video_dataset
    from packer.write.convert import convert_video

    root = Path(workdir) / "frames"
    tree = make_video_tree(root, classes, per_class, frames, size, bad=1, empty=1)
    results, targets = convert_each(tree.root, "jpeg frames", convert_video, progress)

    def open_one(path: Path, output: str) -> Any:
        dataset: Any = open_video_dataset(path, num_frames=num_frames, output=output)
        if path == tree.root:  # the folder as a user reads it: bad videos left out
            good = [i for i, k in enumerate(dataset.keys) if tree.root / k in tree.videos]
            dataset = Subset(dataset, good)
        return dataset

    return tree, results, time_targets(targets, open_one, batch_size=16, repeats=repeats)
