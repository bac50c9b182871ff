"""What ``benchmarks/scale.py`` and ``tests/test_scale.py`` share: an ImageNet-sized tree of tiny
JPEGs made fast (hard links to a handful of distinct files, so a million paths cost seconds and
a few megabytes), the index bytes of an output, and a process's unique set size (USS).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from packer.core.manifest import INDEX_NAME, KEYS_NAME, RECORDS_NAME

__all__ = [
    "MemoryProbe",
    "index_bytes",
    "make_linked_tree",
    "make_packed",
    "private_bytes",
    "tiny_jpegs",
    "uss_bytes",
]


def tiny_jpegs(count: int = 8, size: int = 8, seed: int = 0) -> list[bytes]:
    """``count`` distinct valid JPEGs of ``size``×``size`` noise (a few hundred bytes each)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        pixels = rng.integers(0, 256, size=(size, size, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def make_linked_tree(
    root: str | os.PathLike[str], classes: int, per_class: int, distinct: int = 8
) -> int:
    """``root/cNNNN/img_NNNNNNN.JPEG``: ``classes × per_class`` distinct paths, each a hard link
    to one of ``distinct`` tiny JPEGs kept in ``root/.blobs`` (hidden: not a class; as many
    copies as keep each under ~50,000 links, file systems cap them). A tree already complete is
    kept. Returns the number of images.
    """
    root = Path(root)
    blobs = root / ".blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    total = classes * per_class
    jpegs = tiny_jpegs(distinct)
    sources = []
    for n in range(max(distinct, -(-total // 50_000))):
        path, data = blobs / f"{n}.JPEG", jpegs[n % distinct]
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
        sources.append(str(path))
    done = root / ".complete"
    if done.is_file() and done.read_text() == f"{classes}x{per_class}":
        return total
    number = 0
    for c in range(classes):
        folder = root / f"c{c:04d}"
        folder.mkdir(exist_ok=True)
        existing = set(os.listdir(folder))
        for _ in range(per_class):
            name = f"img_{number:07d}.JPEG"
            if name not in existing:
                os.link(sources[number % len(sources)], os.path.join(folder, name))
            number += 1
    done.write_text(f"{classes}x{per_class}")
    return total


def index_bytes(root: str | os.PathLike[str]) -> int:
    """Bytes of an output's index: ``index.npy`` + ``records.npy`` + ``keys.txt``."""
    return sum(os.path.getsize(Path(root) / name) for name in (INDEX_NAME, RECORDS_NAME, KEYS_NAME))


def private_bytes(pid: int | str = "self") -> tuple[int, int] | None:
    """A process's private pages, ``(clean, dirty)`` bytes, from ``/proc/<pid>/smaps_rollup``
    (None where the kernel does not tell). Their sum is its unique set size (USS). Dirty private
    pages are what copy-on-read would grow (a forked worker writing the refcounts of its
    parent's objects); clean private pages are file pages only this process maps, such as the
    parts of a shard only this worker has read."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            text = fh.read()
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("Private_Clean", "Private_Dirty"):
            fields[name] = int(rest.split()[0]) * 1024
    if len(fields) != 2:
        return None
    return fields["Private_Clean"], fields["Private_Dirty"]


def uss_bytes(pid: int | str = "self") -> int | None:
    """The unique set size of a process (Private_Clean + Private_Dirty), or None."""
    found = private_bytes(pid)
    return None if found is None else sum(found)


class MemoryProbe(Dataset):
    """Wraps a dataset for one epoch in DataLoader workers: each batch is read (and dropped) in
    the worker, which returns ``(worker pid, samples, private bytes at its first batch, private
    bytes now)`` instead, so the parent sees each worker's memory at the start and end of the
    epoch without receiving the data."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self.start: tuple[int, int] | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: list[int]) -> tuple[int, int, Any, Any]:
        if self.start is None:
            self.start = private_bytes()
        batch = self.dataset.__getitems__(indices)
        return os.getpid(), len(batch), self.start, private_bytes()

    def __getitem__(self, i: int) -> tuple[int, int, Any, Any]:
        return self.__getitems__([i])


def make_packed(
    dst: str | os.PathLike[str],
    samples: int,
    classes: int = 10,
    shards: int = 4,
    keys: dict[int, str] | None = None,
) -> Path:
    """A packed LMDB output of ``samples`` tiny JPEGs, written straight through the format's
    writer and the manifest functions (no source tree, no loading pool: ~1 s per 100,000
    samples), for tests of opening large outputs. Sample ``i`` has label ``i * classes //
    samples`` and key ``cNNNN/img_NNNNNNN`` unless ``keys`` gives another.
    """
    from packer.core.manifest import (
        LAYOUT_VERSION,
        RECORD_DTYPE,
        SAMPLE_DTYPE,
        Manifest,
        bytes_checksum,
        write_index,
        write_keys,
        write_manifest,
        write_records,
    )
    from packer.formats import by_name

    root = Path(dst)
    root.mkdir(parents=True)
    fmt = by_name("lmdb")
    jpegs = tiny_jpegs(8)
    checksums = [bytes_checksum(j) for j in jpegs]
    labels = np.arange(samples, dtype=np.int64) * classes // samples
    shard_of = np.arange(samples, dtype=np.int64) * shards // samples
    records = np.zeros(samples, dtype=RECORD_DTYPE)
    records["file"] = shard_of
    which = np.arange(samples) % len(jpegs)
    records["length"] = np.array([len(j) for j in jpegs])[which]
    records["checksum"] = np.array(checksums, dtype=np.uint64)[which]
    names = [f"c{int(c):04d}/img_{i:07d}" for i, c in enumerate(labels.tolist())]
    for i, key in (keys or {}).items():
        names[i] = key
    infos = []
    with fmt.Writer(root, [1 << 20] * shards, "shards", "image") as writer:
        for shard in range(shards):
            rows = np.flatnonzero(shard_of == shard)
            for i in rows.tolist():
                writer.write(shard, names[i], [jpegs[i % len(jpegs)]])
            info = writer.finish_shard()
            assert info is not None
            infos.append(info)
            records["offset"][rows] = writer.final_offsets
    index = np.zeros(samples, dtype=SAMPLE_DTYPE)
    index["label"], index["count"], index["first"] = labels, 1, np.arange(samples)
    files = {
        INDEX_NAME: write_index(root, index),
        RECORDS_NAME: write_records(root, records),
        KEYS_NAME: write_keys(root, names),
    }
    manifest = Manifest(
        format=fmt.NAME,
        kind="image",
        num_samples=samples,
        classes=[f"c{c:04d}" for c in range(classes)],
        shards=infos,
        options={"layout": "shards"},
        files=files,
        layout_version=LAYOUT_VERSION,
    )
    write_manifest(root, manifest)
    return root
