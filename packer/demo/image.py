"""Generate photo-like sample trees: the data of ``make demo``, the benchmarks and the tests.

Images are smooth colour fields with shapes (edges) and fine texture, so their JPEGs have the
size and decode cost of real photos (~100 KB at ~400×350), unlike uniform noise or flat colour.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

__all__ = [
    "DemoRow",
    "DemoTree",
    "convert_each",
    "make_image_tree",
    "photo_like",
    "run_demo",
    "time_targets",
]


def photo_like(rng: np.random.Generator, width: int = 400, height: int = 350) -> Image.Image:
    """One synthetic photo: a smooth background, a few shapes, and grain."""
    grid = rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8)
    image = Image.fromarray(grid, "RGB").resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(int(rng.integers(3, 8))):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        x1, y1 = x0 + _extent(rng, width), y0 + _extent(rng, height)
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        if rng.random() < 0.5:
            draw.ellipse((x0, y0, x1, y1), fill=colour)
        else:
            draw.rectangle((x0, y0, x1, y1), fill=colour)
    image = image.filter(ImageFilter.GaussianBlur(1.2))
    grain = 16.0 * rng.standard_normal((height, width, 1), dtype=np.float32)
    grain = grain + 24.0 * rng.standard_normal((height, width, 3), dtype=np.float32)
    pixels = np.clip(np.asarray(image, dtype=np.float32) + grain, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels, "RGB")


def _extent(rng: np.random.Generator, side: int) -> int:
    """A shape's extent along a side: 20 to side/2 pixels (the draw of photo-sized images is
    unchanged), at least 1 on a small image."""
    if side // 2 > 20:
        return int(rng.integers(20, side // 2))
    return int(rng.integers(1, side // 2 + 2))


@dataclass
class DemoTree:
    """What ``make_image_tree`` wrote."""

    root: Path
    classes: list[str]
    good: list[Path]
    bad: list[Path]


def make_image_tree(
    root: str | os.PathLike[str],
    classes: int = 4,
    per_class: int = 10,
    size: tuple[int, int] = (400, 350),
    quality: int = 90,
    bad: int = 1,
    seed: int = 0,
) -> DemoTree:
    """Write ``root/class_XX/img_XXXXX.JPEG`` photo-like JPEGs, plus ``bad`` truncated ones.

    Args:
        root: folder to create (may exist).
        classes: number of class folders.
        per_class: good images per class.
        size: (width, height) of each image.
        quality: JPEG quality.
        bad: how many truncated JPEGs to add (spread over the classes), as real datasets have.
        seed: random seed; the same seed writes the same bytes.
    """
    rng = np.random.default_rng(seed)
    root_path = Path(root)
    names = [f"class_{c:02d}" for c in range(classes)]
    good: list[Path] = []
    for name in names:
        (root_path / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            path = root_path / name / f"img_{i:05d}.JPEG"
            photo_like(rng, *size).save(path, format="JPEG", quality=quality)
            good.append(path)
    broken: list[Path] = []
    for b in range(bad):
        buffer = io.BytesIO()
        photo_like(rng, *size).save(buffer, format="JPEG", quality=quality)
        path = root_path / names[b % classes] / f"broken_{b:03d}.JPEG"
        path.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        broken.append(path)
    return DemoTree(root_path, names, good, broken)


@dataclass
class DemoRow:
    """One line of the demo's table."""

    name: str
    path: Path
    disk_bytes: int
    bytes_per_s: float
    decoded_per_s: float


def run_demo(
    workdir: str | os.PathLike[str],
    classes: int = 8,
    per_class: int = 100,
    repeats: int = 3,
    progress: bool = True,
) -> tuple[DemoTree, list[Any], list[DemoRow]]:
    """Generate a sample tree, convert it to every format, and time reading each back.

    Returns the tree, each conversion's result and one row per dataset (the JPEG folder first).
    Reading uses a DataLoader with ``num_workers=0``, batch 64, warm page cache, median of
    ``repeats`` interleaved passes.
    """
    from packer.read.datasets import FolderDataset
    from packer.read.open import open_dataset
    from packer.write.convert import convert

    tree = make_image_tree(Path(workdir) / "images", classes=classes, per_class=per_class, bad=1)
    results, targets = convert_each(tree.root, "jpeg folder", convert, progress)
    good = {str(p) for p in tree.good}

    def open_one(path: Path, output: str) -> Any:
        if path == tree.root:  # the folder as a user would read it: broken files left out
            return FolderDataset(path, output=output, is_valid_file=good.__contains__)
        return open_dataset(path, output=output)

    return tree, results, time_targets(targets, open_one, batch_size=64, repeats=repeats)


def convert_each(
    source: Path, name: str, convert: Callable[..., Any], progress: bool
) -> tuple[list[Any], list[tuple[str, Path]]]:
    """Convert ``source`` into every format beside it (``images.lmdb``, ...): the results, and
    the ``(name, path)`` targets to time, ``source`` first under ``name``."""
    results = []
    targets: list[tuple[str, Path]] = [(name, source)]
    for suffix in (".lmdb", ".h5", ".npy", ".bmp"):
        dst = source.with_name(source.name + suffix)
        results.append(convert(source, dst, overwrite=True, progress=progress))
        targets.append((suffix.lstrip("."), dst))
    return results, targets


def time_targets(
    targets: list[tuple[str, Path]],
    open_one: Callable[[Path, str], Any],
    batch_size: int,
    repeats: int,
) -> list[DemoRow]:
    """Time reading each target (``output`` bytes and numpy), interleaved, median of ``repeats``.

    ``open_one(path, output)`` builds the dataset; reading is a DataLoader with ``num_workers=0``.
    """
    from packer.diagnosis.targets import disk_bytes
    from packer.diagnosis.timing import measure_throughput, median_run

    timings: dict[tuple[str, str], list[Any]] = {}
    for _ in range(repeats):
        for name, path in targets:
            for output in ("bytes", "numpy"):
                run = measure_throughput(open_one(path, output), batch_size=batch_size)
                timings.setdefault((name, output), []).append(run)
    return [
        DemoRow(
            name,
            path,
            disk_bytes(path),
            median_run(timings[(name, "bytes")]).images_per_s,
            median_run(timings[(name, "numpy")]).images_per_s,
        )
        for name, path in targets
    ]
