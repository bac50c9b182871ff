"""Decode + training crop through a DataLoader: the library half of ``benchmarks/decode.py``.

Every row turns one stored image into the same thing a training loop gets from torchvision's
``RandomResizedCrop(224)`` + ``PILToTensor``: a 3×224×224 uint8 tensor (row ``npy112``: a
3×112×112 one), batched by :func:`stack_collate`. Rows differ in what is stored (the JPEG folder,
a packed LMDB of the same bytes, a packed LMDB resized at write time to ``short_side=256``, or
decoded 112×112 pixels in NPY), in the JPEG decoder (Pillow or a fast one) and in the method:

- ``decode-then-crop``: the whole image is decoded, then :class:`DecodeThenCrop` draws the crop
  with :func:`packer.decode.transforms.crop_params` (torchvision's sampling, torch's generator) and
  resamples it with Pillow's bilinear ``resize(box=...)`` (torchvision's ``resized_crop`` on a PIL
  image): the honest baseline of a folder + torchvision pipeline;
- ``fused``: :class:`packer.decode.transforms.RandomResizedCrop` on ``output="bytes"``: the same crop
  sampling, decoded at the smallest DCT scale that keeps 224 pixels across the crop;
- ``stored pixels``: ``output="tensor"`` from a decoded NPY, then a random horizontal flip
  (:class:`RandomFlip`); no decode, no resample.

Each pass (:func:`packer.diagnosis.timing.measure_throughput`) runs in a freshly forked child that
applies packer's allocator setting, reads the row's files once (warm page cache, residency
checked with ``mincore``) and seeds torch with 0.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, default_collate

import packer
from harness.forked import in_child
from harness.host_load import QuietWaiter, host_busy_seconds, others_during, own_usage
from harness.throughput import prepare_images, prewarm, resident_all
from packer.core.handles import keep_freed_heap
from packer.core.manifest import MANIFEST_NAME, load_manifest
from packer.decode.outputs import decode
from packer.decode.transforms import RandomResizedCrop
from packer.demo.image import make_image_tree
from packer.diagnosis.targets import close_dataset, data_files
from packer.diagnosis.timing import measure_throughput
from packer.diagnosis.train_transform import DecodedRandomResizedCrop
from packer.errors import PackerError
from packer.source.images import scan

__all__ = [
    "BASELINE",
    "CLASSES",
    "Key",
    "DecodeThenCrop",
    "RandomFlip",
    "Row",
    "Variant",
    "make_rows",
    "prepare_variant",
    "run_rounds",
    "stack_collate",
    "warm_up",
]

BASELINE = "baseline"
CLASSES = 10
STORES = {
    "folder": "images",
    "lmdb": "images.lmdb",
    "lmdb-s256": "images-s256.lmdb",
    "npy112": "images-112.npy",
}


class DecodeThenCrop:
    """torchvision's ``RandomResizedCrop(size)`` on a decoded image, to a 3×H×W uint8 tensor.

    Takes a PIL image or an H×W×3 uint8 array (wrapped without a copy); the crop is
    :class:`packer.diagnosis.train_transform.DecodedRandomResizedCrop` (crop sampling by
    :func:`packer.decode.transforms.crop_params` on torch's global generator, as the fused transform).
    """

    def __init__(
        self,
        size: int = 224,
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        self.crop = DecodedRandomResizedCrop(size, scale, ratio)

    def __call__(self, image: Any) -> torch.Tensor:
        if isinstance(image, np.ndarray):
            pixels = np.ascontiguousarray(image)
            image = Image.frombuffer(
                "RGB", (pixels.shape[1], pixels.shape[0]), pixels, "raw", "RGB", 0, 1
            )
        out = self.crop(image)
        return torch.from_numpy(np.array(out)).permute(2, 0, 1).contiguous()


class RandomFlip:
    """A random horizontal flip of a 3×H×W tensor (torch's generator)."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return image.flip(-1) if torch.rand(1).item() < 0.5 else image


def stack_collate(batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """torch's ``default_collate`` (one B×3×H×W tensor, in shared memory inside a worker), as a
    tuple so that :func:`measure_throughput` counts its samples."""
    images, labels = default_collate(list(batch))
    return images, labels


@dataclass(frozen=True)
class Row:
    """One pipeline of the table; ``target`` is a ratio to ``versus`` in the same setting."""

    name: str
    store: str  # a key of STORES
    decoder: str
    method: str  # "decode-then-crop", "fused" or "stored pixels"
    target: float | None = None
    versus: str = BASELINE


def make_rows(fast: str, npy112: bool = True) -> list[Row]:
    """The rows, baseline first; ``fast`` is the fast decoder's name (or ``"auto"``)."""
    rows = [
        Row(BASELINE, "folder", "pillow", "decode-then-crop"),
        Row("lmdb pillow", "lmdb", "pillow", "decode-then-crop"),
        Row("lmdb fast", "lmdb", fast, "decode-then-crop", 1.25),
        Row("s256 pillow", "lmdb-s256", "pillow", "decode-then-crop", 2.5),
        Row("s256 fast", "lmdb-s256", fast, "decode-then-crop", 3.0),
        Row("fused pillow", "lmdb", "pillow", "fused", None, "lmdb pillow"),
        Row("fused fast", "lmdb", fast, "fused", 1.2, "lmdb fast"),
    ]
    if npy112:
        rows.append(Row("npy112", "npy112", "-", "stored pixels", 10.0))
    return rows


@dataclass
class Variant:
    """One image set: its name, size, count, and each store's path (None: not available)."""

    name: str
    size: tuple[int, int]
    images: int
    paths: dict[str, Path | None]
    notes: dict[str, str]


def _complete(dst: Path, images: int) -> bool:
    try:
        return (dst / MANIFEST_NAME).is_file() and load_manifest(dst).num_samples == images
    except PackerError:
        return False


def _tree(root: Path, images: int, size: tuple[int, int], log: Callable[[str], None]) -> Path:
    """``root/n<images>-<w>x<h>/images``: a photo-like tree of another size (made or reused)."""
    work = root / f"n{images}-{size[0]}x{size[1]}"
    src, marker = work / "images", work / "images.json"
    expected = {"classes": CLASSES, "per_class": images // CLASSES, "size": list(size), "seed": 0}
    try:
        if json.loads(marker.read_text()) == expected and len(scan(src).samples) == images:
            log(f"reusing {src} ({images} JPEGs)")
            return src
    except (OSError, ValueError, PackerError):
        pass
    if src.exists():
        shutil.rmtree(src)
    work.mkdir(parents=True, exist_ok=True)
    log(f"generating {images} photo-like {size[0]}x{size[1]} JPEGs in {src} ...")
    make_image_tree(src, classes=CLASSES, per_class=images // CLASSES, size=size, bad=0)
    marker.write_text(json.dumps(expected))
    for name in STORES.values():  # outputs of an older tree are stale
        if name != "images" and (work / name).exists():
            shutil.rmtree(work / name)
    return src


def prepare_variant(
    root: Path,
    name: str,
    images: int,
    size: tuple[int, int],
    log: Callable[[str], None],
    npy112: bool = True,
) -> Variant:
    """Make or reuse the JPEG tree and its LMDB, ``short_side=256`` LMDB and 112-px NPY.

    400×350 trees are ``harness.throughput.prepare_images``' (``root/n<images>``, shared
    with ``read_throughput.py``). The NPY needs ``packer.convert(..., size=112)``; when packer
    refuses it, the variant has no ``npy112`` path and a note says why.
    """
    if size == (400, 350):
        src, outputs = prepare_images(root, images, log, {"lmdb": ".lmdb"})
        lmdb = outputs["lmdb"]
    else:
        src = _tree(root, images, size, log)
        lmdb = src.parent / STORES["lmdb"]
    paths: dict[str, Path | None] = {"folder": src, "lmdb": lmdb}
    notes: dict[str, str] = {}
    wanted: list[tuple[str, dict[str, Any]]] = [
        ("lmdb", {}),
        ("lmdb-s256", {"short_side": 256}),
    ]
    if npy112:
        wanted.append(("npy112", {"size": 112}))
    for store, options in wanted:
        dst = src.parent / STORES[store]
        if _complete(dst, images):
            log(f"reusing {dst}")
            paths[store] = dst
            continue
        log(f"converting to {dst} {options or ''} ...")
        start = time.perf_counter()
        try:
            packer.convert(src, dst, overwrite=True, progress=False, **options)
        except (PackerError, TypeError) as exc:
            notes[store] = f"packer.convert(..., {options}) refused: {exc}"
            log(f"  skipped: {notes[store]}")
            paths[store] = None
            continue
        log(f"  done in {time.perf_counter() - start:.1f} s")
        paths[store] = dst
    return Variant(name, size, images, paths, notes)


def warm_up(variants: Sequence[Variant], rows: Sequence[Row], crop: int) -> None:
    """Load every decoder library and Pillow plugin once in this (the parent) process, so that
    no forked pass pays an import: one image of each variant through each row's transform."""
    for variant in variants:
        folder = variant.paths["folder"]
        assert folder is not None
        data = Path(scan(folder).samples[0].path).read_bytes()
        for row in rows:
            if row.method == "fused":
                RandomResizedCrop(crop, decoder=row.decoder, output="tensor")(data)
            elif row.method == "decode-then-crop":
                output = "pil" if row.decoder == "pillow" else "numpy"
                DecodeThenCrop(crop)(decode(data, output, row.decoder))


def make_dataset(row: Row, path: Path, crop: int) -> Dataset:
    """A fresh dataset for one pass of ``row`` over ``path``."""
    if row.method == "stored pixels":
        return packer.open_dataset(path, output="tensor", transform=RandomFlip())
    if row.method == "fused":
        fused = RandomResizedCrop(crop, decoder=row.decoder, output="tensor")
        return packer.open_dataset(path, output="bytes", transform=fused)
    output = "pil" if row.decoder == "pillow" else "numpy"  # fast decoders return arrays
    if row.store == "folder":
        return packer.FolderDataset(
            path, output=output, decoder=row.decoder, transform=DecodeThenCrop(crop)
        )
    return packer.open_dataset(
        path, output=output, decoder=row.decoder, transform=DecodeThenCrop(crop)
    )


def one_pass(
    row: Row,
    path: Path,
    workers: int,
    batch_size: int,
    crop: int,
    files: list[Path],
    threads: int = 1,
) -> dict[str, Any]:
    """One timed pass of ``row`` on a fresh dataset in this process, page cache warm.

    ``threads``: torch's intra-op threads in this process (0: leave torch's default). DataLoader
    workers always run with 1; the default gives ``num_workers=0`` the same.
    """
    keep_freed_heap()  # packer's allocator setting, for the folder baseline too
    previous = torch.get_num_threads()
    if threads > 0:
        torch.set_num_threads(threads)
    try:
        return _timed(row, path, workers, batch_size, crop, files)
    finally:
        torch.set_num_threads(previous)


def _timed(
    row: Row, path: Path, workers: int, batch_size: int, crop: int, files: list[Path]
) -> dict[str, Any]:
    dataset = make_dataset(row, path, crop)
    resident = resident_all(files)
    if resident is None or resident < 1.0:
        prewarm(files)
        resident = resident_all(files)
    torch.manual_seed(0)
    gc.collect()
    host_before, (cpu_before, faults_before) = host_busy_seconds(), own_usage()
    try:
        result = measure_throughput(
            dataset, num_workers=workers, batch_size=batch_size, collate_fn=stack_collate
        )
        host_after, (cpu_after, faults_after) = host_busy_seconds(), own_usage()
    finally:
        close_dataset(dataset)
        del dataset
        gc.collect()
    own_cpu = cpu_after - cpu_before
    return {
        **result.to_dict(),
        "output_bytes_per_image": result.bytes / max(result.images, 1),
        "resident_before": resident,
        "cpu_s": own_cpu,
        "minor_faults_per_image": (faults_after - faults_before) / max(result.images, 1),
        "others_cpu_share": others_during(host_before, host_after, own_cpu, result.seconds),
    }


Key = tuple[str, str, int]  # (variant, row, workers)


def run_rounds(
    variants: Sequence[Variant],
    rows: Sequence[Row],
    workers: Sequence[int],
    repeats: int,
    batch_size: int,
    crop: int,
    waiter: QuietWaiter | None,
    log: Callable[[str], None],
    in_process: bool = False,
    threads: int = 1,
) -> dict[Key, list[dict[str, Any]]]:
    """Every (variant, row, workers) ``repeats`` times, interleaved; every other round backwards."""
    plan = [
        (variant, row, w)
        for variant in variants
        for w in workers
        for row in rows
        if variant.paths.get(row.store) is not None
    ]
    files = {v.name: {s: data_files(p) for s, p in v.paths.items() if p} for v in variants}
    runs: dict[Key, list[dict[str, Any]]] = {(v.name, r.name, w): [] for v, r, w in plan}
    for number in range(repeats):
        start = time.perf_counter()
        for variant, row, w in plan if number % 2 == 0 else plan[::-1]:
            waited = waiter.wait() if waiter is not None else 0.0
            path = variant.paths[row.store]
            assert path is not None
            args = (row, path, w, batch_size, crop, files[variant.name][row.store], threads)
            if in_process or not hasattr(os, "fork"):
                result = one_pass(*args)
            else:
                result = in_child(one_pass, *args)
            result["waited_s"] = waited
            runs[(variant.name, row.name, w)].append(result)
            others = result["others_cpu_share"]
            log(
                f"round {number + 1}/{repeats} {variant.name:>9} {row.name:>12} w{w}: "
                f"{result['images_per_s']:8,.0f} img/s"
                + (f" others {100 * others:3.0f}%" if others is not None else "")
                + (f" waited {waited:.1f}s" if waited >= 0.05 else "")
            )
        log(f"round {number + 1} took {time.perf_counter() - start:.0f} s")
    return runs
