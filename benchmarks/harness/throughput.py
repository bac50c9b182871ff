"""Read throughput of packer's formats against the JPEG folder and an in-memory ceiling.

The library half of ``benchmarks/read_throughput.py``: the image data it generates and converts,
the configurations (dataset, mode, workers, cache, collate) it sweeps, and one timed pass of a
configuration (:func:`packer.diagnosis.timing.measure_throughput`), each in a freshly forked child
by default, with CPU time, page faults and the other processes' CPU share recorded.

Baselines measured in the same run: the JPEG folder (``packer.FolderDataset``), the JPEG bytes in
memory, and, next to packer's LMDB reader, a plain py-lmdb reader of the same files
(:class:`harness.plain_lmdb.PlainLMDBDataset`, bytes mode only). With ``same_allocator``
(the default) every pass first applies packer's allocator setting
(:func:`packer.core.handles.keep_freed_heap`), so the baselines run under the glibc trim threshold
packer's readers set for themselves.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.utils.data import Dataset

import packer
from harness.forked import in_child
from harness.host_load import QuietWaiter, host_busy_seconds, others_during, own_usage
from harness.plain_lmdb import PlainLMDBDataset
from packer.core.handles import keep_freed_heap
from packer.core.manifest import MANIFEST_NAME, load_manifest
from packer.decode.outputs import decode
from packer.demo.image import make_image_tree
from packer.diagnosis.io_counters import resident_fraction
from packer.diagnosis.targets import close_dataset, data_files, evict_page_cache
from packer.diagnosis.timing import measure_throughput
from packer.errors import PackerError
from packer.source.images import scan

__all__ = [
    "CLASSES",
    "FOLDER",
    "FORMATS",
    "MEMORY",
    "MODES",
    "PLAIN_LMDB",
    "Config",
    "InMemoryDataset",
    "ThroughputBench",
    "make_configs",
    "prepare_images",
    "run_rounds",
]

CLASSES = 10
FOLDER = "jpeg folder"
MEMORY = "memory"
PLAIN_LMDB = "plain lmdb"  # py-lmdb by hand over the LMDB output (bytes mode only)
FORMATS = {"lmdb": ".lmdb", "hdf5": ".h5", "npy": ".npy", "bmp": ".bmp"}
MODES = {"bytes": "bytes", "decoded": "numpy"}  # mode -> the datasets' output=
DEFAULT_COLLATE = "default"  # measure_throughput's own list collate
COLLATE_BYTES = "collate_bytes"


class InMemoryDataset(Dataset):
    """The JPEG bytes held in a Python list: what reading costs with no I/O at all.

    ``bytes`` returns the stored object itself (no copy); ``numpy`` decodes it with the same
    ``packer.decode.outputs.decode`` every packer dataset uses.
    """

    def __init__(self, blobs: Sequence[bytes], labels: Sequence[int], output: str) -> None:
        self.blobs = list(blobs)
        self.labels = [int(x) for x in labels]
        self.output = output

    def __len__(self) -> int:
        return len(self.blobs)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        data = self.blobs[i]
        return (data if self.output == "bytes" else decode(data, self.output)), self.labels[i]


def resident_all(paths: Iterable[Path]) -> float | None:
    """Fraction of *all* the files' pages in the page cache (``mincore``); None off Linux."""
    files = list(paths)
    return resident_fraction(files, max_files=max(1, len(files)))


def prewarm(paths: Iterable[Path]) -> None:
    """Read every file once so its pages are in the page cache."""
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while fh.read(8 << 20):
                pass


def prepare_images(
    root: Path, images: int, log: Callable[[str], None], formats: dict[str, str] | None = None
) -> tuple[Path, dict[str, Path]]:
    """Make (or reuse) ``root/n<images>/images`` (10 classes) and its packed copies.

    ``formats`` maps a name to a suffix (default: :data:`FORMATS`, all four). Returns the
    tree's path and each copy's path by name.
    """
    per_class = images // CLASSES
    work = root / f"n{images}"
    src = work / "images"
    marker = work / "images.json"
    expected = {"classes": CLASSES, "per_class": per_class, "bad": 0, "seed": 0}
    reuse = False
    if marker.is_file() and src.is_dir():
        try:
            reuse = json.loads(marker.read_text()) == expected and len(scan(src).samples) == images
        except (ValueError, PackerError):
            reuse = False
    if reuse:
        log(f"reusing {src} ({images} JPEGs)")
    else:
        if src.exists():
            shutil.rmtree(src)
        marker.unlink(missing_ok=True)
        log(f"generating {images} photo-like JPEGs in {src} ...")
        start = time.perf_counter()
        make_image_tree(src, classes=CLASSES, per_class=per_class, bad=0)
        marker.write_text(json.dumps(expected))
        log(f"  done in {time.perf_counter() - start:.1f} s")
    outputs: dict[str, Path] = {}
    for name, suffix in (FORMATS if formats is None else formats).items():
        dst = work / f"images{suffix}"
        outputs[name] = dst
        if reuse and _is_complete(dst, images):  # a regenerated source invalidates outputs
            log(f"reusing {dst}")
            continue
        log(f"converting to {dst} ...")
        start = time.perf_counter()
        packer.convert(src, dst, overwrite=True, progress=False)
        log(f"  done in {time.perf_counter() - start:.1f} s")
    return src, outputs


def _is_complete(dst: Path, images: int) -> bool:
    if not (dst / MANIFEST_NAME).is_file():
        return False
    try:
        return load_manifest(dst).num_samples == images
    except PackerError:
        return False


@dataclass(frozen=True)
class Config:
    """One measured configuration."""

    dataset: str
    mode: str
    workers: int
    cache: str  # "warm", "cold", or "-" for the in-memory dataset
    collate: str

    @property
    def setting(self) -> tuple[str, int, str]:
        """The (mode, workers, cache) the baseline ratios are taken in."""
        return self.mode, self.workers, self.cache


def make_configs(
    datasets: Sequence[str],
    modes: Sequence[str],
    workers: Sequence[int],
    caches: Sequence[str],
    cold_decoded_workers: Sequence[int] | None = None,
) -> list[Config]:
    """Every configuration, in the order of the table and of each round.

    :data:`PLAIN_LMDB` runs in bytes mode only: decoding dominates decoded passes, and packer's
    LMDB reader shares its decode with every other dataset.

    ``cold_decoded_workers`` limits decoded passes with a cold cache to those worker counts
    (None: all of ``workers``); decoding dominates them, and each costs a ~10 s pass.
    """
    configs = []
    for mode in modes:
        for w in workers:
            collates = [DEFAULT_COLLATE] + ([COLLATE_BYTES] if mode == "bytes" and w > 0 else [])
            for collate in collates:
                if MEMORY in datasets:
                    configs.append(Config(MEMORY, mode, w, "-", collate))
                for cache in caches:
                    if (
                        mode == "decoded"
                        and cache == "cold"
                        and cold_decoded_workers is not None
                        and w not in cold_decoded_workers
                    ):
                        continue
                    for name in datasets:
                        if name != MEMORY and (name != PLAIN_LMDB or mode == "bytes"):
                            configs.append(Config(name, mode, w, cache, collate))
    return configs


class ThroughputBench:
    """The datasets' paths and the in-memory bytes; runs single timed passes."""

    def __init__(
        self,
        src: Path,
        outputs: dict[str, Path],
        batch_size: int,
        in_process: bool = False,
        same_allocator: bool = True,
        mmap_threshold: int = 0,
    ) -> None:
        self.in_process = in_process
        self.same_allocator = same_allocator
        self.mmap_threshold = mmap_threshold
        self.paths: dict[str, Path] = {FOLDER: src, **outputs}
        if "lmdb" in outputs:
            self.paths[PLAIN_LMDB] = outputs["lmdb"]
        self.files = {name: data_files(path) for name, path in self.paths.items()}
        self.batch_size = batch_size
        samples = scan(src).samples
        self.blobs = [Path(s.path).read_bytes() for s in samples]
        self.labels = [s.label for s in samples]

    def make_dataset(self, name: str, mode: str, collate: str = "default") -> Dataset:
        """A fresh dataset for one pass (packed ones read raw batches into one buffer when the
        batch goes to ``collate_bytes``)."""
        output = MODES[mode]
        if name == MEMORY:
            return InMemoryDataset(self.blobs, self.labels, output)
        if name == FOLDER:
            return packer.FolderDataset(self.paths[name], output=output)
        if name == PLAIN_LMDB:
            return PlainLMDBDataset(self.paths[name], output=output)
        buffer: dict[str, Any] = (
            {"batch_buffer": True} if collate == COLLATE_BYTES and output == "bytes" else {}
        )
        return packer.open_dataset(self.paths[name], output=output, **buffer)

    def run(self, config: Config, waiter: QuietWaiter | None = None) -> dict[str, Any]:
        """One timed pass of ``config``, in a forked child unless ``in_process``."""
        waited = waiter.wait() if waiter is not None else 0.0
        if self.in_process or not hasattr(os, "fork"):
            result = self.one_pass(config)
        else:
            result = in_child(self.one_pass, config)
        return {**result, "waited_s": waited}

    def set_cache(self, config: Config) -> float | None:
        """Evict (cold) or read in (warm) the dataset's files; return the resident fraction."""
        files = self.files.get(config.dataset, [])
        if config.cache == "cold":
            evict_page_cache(files)
            return resident_all(files)
        if config.cache != "warm":
            return None
        resident = resident_all(files)
        if resident is None or resident < 1.0:
            prewarm(files)
            resident = resident_all(files)
        return resident

    def one_pass(self, config: Config) -> dict[str, Any]:
        """One timed pass of ``config`` on a fresh dataset, in this process."""
        if self.same_allocator:
            keep_freed_heap()  # what packer's readers do on their first handle; for baselines too
        if self.mmap_threshold:  # a what-if: glibc's M_MMAP_THRESHOLD (-3), fixed
            ctypes.CDLL("libc.so.6").mallopt(-3, self.mmap_threshold)
        dataset = self.make_dataset(config.dataset, config.mode, config.collate)
        resident = self.set_cache(config)
        gc.collect()
        host_before, (cpu_before, faults_before) = host_busy_seconds(), own_usage()
        try:
            result = measure_throughput(
                dataset,
                num_workers=config.workers,
                batch_size=self.batch_size,
                collate_fn=packer.collate_bytes if config.collate == COLLATE_BYTES else None,
            )
            host_after, (cpu_after, faults_after) = host_busy_seconds(), own_usage()
        finally:
            close_dataset(dataset)  # unmap shards: mapped pages cannot be evicted by the next pass
            del dataset
            gc.collect()
        own_cpu = cpu_after - cpu_before
        return {
            **result.to_dict(),
            "resident_before": resident,
            "cpu_s": own_cpu,
            "minor_faults_per_image": (faults_after - faults_before) / max(result.images, 1),
            "others_cpu_share": others_during(host_before, host_after, own_cpu, result.seconds),
        }


def pass_line(round_number: int, repeats: int, config: Config, result: dict[str, Any]) -> str:
    """One progress line: the pass, its rates, the wait for quiet, others' CPU, residency."""
    line = (
        f"round {round_number + 1}/{repeats} {config.dataset:>11} {config.mode:>7} "
        f"w{config.workers} {config.cache:>4} {config.collate:>13}: "
        f"{result['images_per_s']:8,.0f} img/s {result['mb_per_s']:7,.0f} MB/s"
    )
    if result["waited_s"] >= 0.05:
        line += f" waited {result['waited_s']:.1f}s"
    if result["others_cpu_share"] is not None:
        line += f" others {100 * result['others_cpu_share']:3.0f}%"
    if result["resident_before"] is not None:
        line += f" (resident {100 * result['resident_before']:.0f}%)"
    return line


def run_rounds(
    bench: ThroughputBench,
    configs: Sequence[Config],
    repeats: int,
    waiter: QuietWaiter | None,
    log: Callable[[str], None],
) -> dict[Config, list[dict[str, Any]]]:
    """Every configuration ``repeats`` times, interleaved; every other round runs backwards, so
    a slow drift of the machine favours no one."""
    runs: dict[Config, list[dict[str, Any]]] = {c: [] for c in configs}
    for round_number in range(repeats):
        round_start = time.perf_counter()
        for config in configs if round_number % 2 == 0 else configs[::-1]:
            result = bench.run(config, waiter)
            runs[config].append(result)
            log(pass_line(round_number, repeats, config, result))
        log(f"round {round_number + 1} took {time.perf_counter() - round_start:.0f} s")
    return runs
