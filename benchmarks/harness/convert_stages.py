"""What one image costs in each stage of a conversion, measured stage by stage on one thread, and
what that predicts for a machine with more cores (``benchmarks/scale_convert.py --stages``).

Each stage runs alone over the same files (warm page cache), repeated; the median per image is
kept, as CPU seconds of this thread and as wall seconds (they differ where the stage waits for
the disk: the fsync). The stages are those of :mod:`packer.write.pipeline`'s pipeline: the scan; on the
pool's workers, reading a file, checking it, checksumming it; on the writing thread, LMDB puts
(with the writer's commits every 1,024 records); on the finishing thread, the shard's last
commit, its fsync, its value offsets and its checksum.
"""

from __future__ import annotations

import functools
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packer.core.manifest import bytes_checksum, file_checksum
from packer.decode.check import check_image
from packer.formats import lmdb as lmdb_format
from packer.source.images import scan
from packer.write.loading import load_image, load_in_order, read_input
from packer.write.overlap import keep_heap_for_writes
from packer.write.pipeline import _LOAD_BATCH_BYTES

__all__ = ["FINISHER", "PARALLEL", "RECEIVER", "WRITER", "measure_stages", "project"]

# Where each stage runs in the pipeline: on every pool worker, or on one thread of the parent.
PARALLEL = ("read", "check fast", "check scan", "xxh3")
RECEIVER = "pool results (parent)"  # the process pool's results, received by the parent
WRITER = ("lmdb put + commits",)
FINISHER = ("lmdb commit + fsync", "value offsets", "shard checksum")


def _timed(fn: Callable[[], Any], repeats: int, count: int) -> tuple[float, float]:
    """Median (CPU seconds of this thread, wall seconds) per item of ``fn()`` over ``count``."""
    cpu, wall = [], []
    for _ in range(repeats):
        c0, w0 = time.thread_time(), time.perf_counter()
        fn()
        cpu.append((time.thread_time() - c0) / count)
        wall.append((time.perf_counter() - w0) / count)
    return statistics.median(cpu), statistics.median(wall)


def _candidates(datas: list[bytes]) -> dict[str, Callable[[], Any]]:
    """Cheaper scan checks measured alongside (simplejpeg's smallest-scale decode, if present)."""
    out: dict[str, Callable[[], Any]] = {}
    try:
        import simplejpeg
    except ImportError:
        return out

    def small() -> None:
        for d in datas:
            simplejpeg.decode_jpeg(d, min_height=1, min_width=1)

    out["candidate: simplejpeg 1/8 decode"] = small
    return out


def _write_shard(root: Path, datas: list[bytes]) -> dict[str, float]:
    """Wall and CPU seconds of writing ``datas`` as one LMDB shard with packer's writer."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    writer = lmdb_format.Writer(root, [sum(map(len, datas))], "shards", "image")
    c0, w0 = time.thread_time(), time.perf_counter()
    for n, data in enumerate(datas):
        writer.write(0, f"k{n}", [data])
    c1, w1 = time.thread_time(), time.perf_counter()
    info = writer.finish_shard()
    c2, w2 = time.thread_time(), time.perf_counter()
    assert info is not None
    path = root / info.name
    lmdb_format.value_offsets(path, len(datas))
    c3, w3 = time.thread_time(), time.perf_counter()
    file_checksum(path)
    c4, w4 = time.thread_time(), time.perf_counter()
    finish_rest = (c4 - c2, w4 - w2)  # offsets + checksum, measured again after the finish
    return {
        "lmdb put + commits": (c1 - c0, w1 - w0),
        "lmdb commit + fsync": (c2 - c1 - finish_rest[0], w2 - w1 - finish_rest[1]),
        "value offsets": (c3 - c2, w3 - w2),
        "shard checksum": (c4 - c3, w4 - w3),
    }  # type: ignore[dict-item]


def _pool_parent(samples: list[Any], repeats: int) -> dict[str, float]:
    """The converting process's own CPU seconds per image to receive a process pool's loaded
    images (pickled bytes through a pipe), as :func:`packer.write.pipeline.write_shards` loads them."""
    loader = functools.partial(load_image, check="fast")
    cpu = []
    for _ in range(repeats):
        t0 = os.times()
        for _loaded in load_in_order(loader, samples, 2, True, _LOAD_BATCH_BYTES):
            pass
        t1 = os.times()
        cpu.append((t1.user - t0.user + t1.system - t0.system) / len(samples))
    return {"cpu": statistics.median(cpu), "wall": statistics.median(cpu)}


def measure_stages(src: Path, work: Path, repeats: int = 3) -> dict[str, dict[str, float]]:
    """Per image: ``{stage: {"cpu": s, "wall": s}}`` for every stage of a conversion of ``src``."""
    keep_heap_for_writes()  # as the converting process does (before its pool forks)
    found = scan(src)
    paths = [s.path for s in found.samples]
    n = len(paths)
    datas = [read_input(p) for p in paths]
    stages: dict[str, Callable[[], Any]] = {
        "scan": lambda: scan(src),
        "read": lambda: [read_input(p) for p in paths],
        "check fast": lambda: [check_image(d, "fast") for d in datas],
        "check scan": lambda: [check_image(d, "scan") for d in datas],
        "check decode": lambda: [check_image(d, "decode") for d in datas],
        "xxh3": lambda: [bytes_checksum(d) for d in datas],
        **_candidates(datas),
    }
    result: dict[str, dict[str, float]] = {}
    for name, fn in stages.items():
        cpu, wall = _timed(fn, repeats, n)
        result[name] = {"cpu": cpu, "wall": wall}
    result["pool results (parent)"] = _pool_parent(found.samples, repeats)
    runs = [_write_shard(work / "stage-shard", datas) for _ in range(repeats)]
    shutil.rmtree(work / "stage-shard", ignore_errors=True)
    for name in runs[0]:
        result[name] = {
            "cpu": statistics.median(r[name][0] for r in runs) / n,
            "wall": statistics.median(r[name][1] for r in runs) / n,
        }
    result["_images"] = {"cpu": n, "wall": n}
    result["_bytes"] = {"cpu": sum(map(len, datas)) / n, "wall": sum(map(len, datas)) / n}
    return result


def project(stages: dict[str, dict[str, float]], check: str, cores: int, files: int) -> dict:
    """Seconds for ``files`` such images on ``cores`` cores, if the pipeline keeps its threads
    busy at once: the pool's stages spread over all cores but one (the converting process's
    threads take about one), and each of the converting process's threads — receiving a process
    pool's results (the scan check's), writing, finishing shards — as long as its own stages."""
    parallel = sum(stages[s]["cpu"] for s in ("read", f"check {check}", "xxh3"))
    per_thread = {
        "pool": parallel / max(1, cores - 1),
        "receiving thread": stages[RECEIVER]["cpu"] if check != "fast" else 0.0,
        "writing thread": sum(stages[s]["cpu"] for s in WRITER),
        "finishing thread": sum(stages[s]["wall"] for s in FINISHER),
    }
    bound = max(per_thread, key=lambda k: per_thread[k])
    cpu = parallel + per_thread["receiving thread"] + per_thread["writing thread"]
    return {
        "cores": cores,
        "files": files,
        "seconds": per_thread[bound] * files,
        "bound_by": bound,
        "cpu_seconds": (cpu + sum(stages[s]["cpu"] for s in FINISHER)) * files,
    }


def scan_share(stages: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each pipeline stage's share of a default (``scan``) conversion's CPU seconds."""
    names = ("read", "check scan", "xxh3", RECEIVER, *WRITER, *FINISHER)
    total = sum(stages[s]["cpu"] for s in names)
    return {s: stages[s]["cpu"] / total for s in names}


def environment() -> dict[str, Any]:
    """The load on the machine while measuring (other processes share its cores)."""
    return {"loadavg": os.getloadavg(), "cpus": os.cpu_count()}
