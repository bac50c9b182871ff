"""``packer doctor URL``: how far the store is, how fast it answers, and what to set for it.

A dataset at a URL is limited by the network, not the disk: the doctor measures, with a
bounded number of requests,

1. the open (manifest and tables fetched and checked);
2. the latency of a small ranged GET (median and 90th percentile over a spread of offsets);
3. the bandwidth of one stream and of several streams in flight together;
4. a batch of samples read in order and a batch at random positions (ranged GETs, coalesced);

and from them recommends ``num_workers`` (enough batches in flight to hide the latency at your
step time), ``prefetch`` (shards fetched ahead so a shard is local before it is read) and
``cache_limit`` (the node-local cache that makes the second epoch local).
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from packer.core.cpus import available_cpus
from packer.core.sizes import format_size
from packer.errors import PackerError
from packer.read.store import Packed, open_packed
from packer.remote.cache import ShardCache, default_cache_dir

__all__ = ["RemoteReport", "doctor_remote"]

_PROBE = 4096  # bytes of a latency probe
_STREAM = 16 << 20  # bytes of the single-stream bandwidth probe
_STREAMS = 4  # streams in flight for the parallel probe


@dataclass
class RemoteReport:
    """What ``packer doctor URL`` measured and recommends."""

    url: str
    format: str
    samples: int
    dataset_bytes: int
    shard_bytes: int  # the median data file's size
    batch_size: int
    step_ms: float | None
    open_s: float = 0.0
    latency_ms: list[float] = field(default_factory=list)
    stream_mb_s: float = 0.0
    streams_mb_s: float = 0.0
    in_order_ms: float = 0.0  # one batch of consecutive samples
    shuffled_ms: float = 0.0  # one batch of samples at random positions
    cache_free_bytes: int | None = None
    cached_files: int = 0  # this dataset's data files in the node-local cache
    cached_bytes: int = 0
    files: int = 0  # its data files in all
    workers: int = 0
    prefetch: int = 0
    cache_limit: int = 0
    findings: list[str] = field(default_factory=list)
    recommendations: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def latency_median_ms(self) -> float:
        return statistics.median(self.latency_ms) if self.latency_ms else 0.0

    @property
    def latency_p90_ms(self) -> float:
        ordered = sorted(self.latency_ms)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))] if ordered else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["latency_median_ms"] = self.latency_median_ms
        data["latency_p90_ms"] = self.latency_p90_ms
        return data

    def __str__(self) -> str:
        return render(self)


def _files(packed: Packed) -> tuple[list[str], list[int]]:
    """The data files of the output (names, sizes): its shards, or per-sample files."""
    reader: Any = packed.reader
    shards = packed.manifest.shards
    if shards:
        return [s.name for s in shards], [int(s.bytes) for s in shards]
    names = [reader.file_name(f) for f in range(min(len(packed.counts), 64))]
    sizes = reader.remote.sizes(names)
    return [n for n in names if n in sizes], [sizes[n] for n in names if n in sizes]


def _latency(folder: Any, names: list[str], sizes: list[int], probes: int) -> list[float]:
    """Milliseconds of ``probes`` sequential small ranged GETs spread over the files (the
    first request, which opens the connection, is not counted)."""
    times: list[float] = []
    for k in range(probes + 1):
        f = k % len(names)
        start = max(0, (sizes[f] - _PROBE) * (k % 7) // 7)
        began = time.perf_counter()
        folder.read_runs([names[f]], [start], [min(sizes[f], start + _PROBE)])
        if k:
            times.append(1e3 * (time.perf_counter() - began))
    return times


def _bandwidth(folder: Any, names: list[str], sizes: list[int]) -> tuple[float, float]:
    """MB/s of one large ranged GET, and of :data:`_STREAMS` ranges in flight together."""
    big = int(np.argmax(sizes))
    size = min(_STREAM, sizes[big])
    began = time.perf_counter()
    folder.read_runs([names[big]], [0], [size])
    one = size / max(1e-9, time.perf_counter() - began) / 1e6
    order = np.argsort(sizes)[::-1][:_STREAMS].tolist()
    each = [min(_STREAM // _STREAMS, sizes[f]) for f in order]
    while len(order) < _STREAMS:  # fewer files than streams: ranges of the biggest
        order.append(big)
        each.append(min(_STREAM // _STREAMS, sizes[big] // _STREAMS))
    starts = [(k * (sizes[f] - n) // _STREAMS) for k, (f, n) in enumerate(zip(order, each))]
    began = time.perf_counter()
    folder.read_runs([names[f] for f in order], starts, [a + n for a, n in zip(starts, each)])
    many = sum(each) / max(1e-9, time.perf_counter() - began) / 1e6
    return one, many


def _batch_ms(packed: Packed, samples: np.ndarray) -> float:
    """Milliseconds to fetch the records of ``samples`` (one coalesced, concurrent request)."""
    records = np.concatenate(
        [np.arange(packed.first[i], packed.first[i] + packed.counts[i]) for i in samples]
    )
    began = time.perf_counter()
    packed.reader.read_many(records)
    return 1e3 * (time.perf_counter() - began)


def _advise(r: RemoteReport) -> None:
    """Fill ``workers``, ``prefetch``, ``cache_limit``, findings and recommendations."""
    cpus = available_cpus()
    per_sample = r.dataset_bytes / max(1, r.samples)
    batch_bytes = per_sample * r.batch_size
    if r.step_ms:
        # each worker has one batch in flight: enough of them to cover a shuffled batch's wait
        r.workers = max(1, math.ceil(r.shuffled_ms / r.step_ms))
    else:
        batch_mb_s = batch_bytes / max(1e-6, r.shuffled_ms / 1e3) / 1e6
        r.workers = max(1, math.ceil(r.streams_mb_s / max(1e-6, batch_mb_s)))
    if r.workers > 4 * cpus:  # workers waiting on the network need little CPU, but memory
        r.findings.append(
            f"hiding the store's wait would take {r.workers} workers; capped at {4 * cpus} "
            f"(4 per CPU): a larger batch or a warm cache (cache_limit) is the fix"
        )
        r.workers = 4 * cpus
    shard_s = r.latency_median_ms / 1e3 + r.shard_bytes / max(1.0, r.stream_mb_s * 1e6)
    samples_per_shard = max(1.0, r.shard_bytes / max(1.0, per_sample))
    step = (r.step_ms or r.in_order_ms) / 1e3 / max(1, r.batch_size)  # seconds per sample
    consume_s = max(1e-6, samples_per_shard * step)
    r.prefetch = min(8, 1 + math.ceil(shard_s / consume_s))
    working = (r.prefetch + 1 + r.workers) * r.shard_bytes  # shards in flight and being read
    fits = r.cache_free_bytes is None or r.dataset_bytes <= 0.8 * r.cache_free_bytes
    r.cache_limit = r.dataset_bytes if fits else max(working, int(0.8 * (r.cache_free_bytes or 0)))
    r.findings.append(
        f"a request waits {r.latency_median_ms:.1f} ms before its first byte; a shuffled batch "
        f"of {r.batch_size} takes {r.shuffled_ms:.0f} ms, a batch in order {r.in_order_ms:.0f} ms"
    )
    if r.streams_mb_s > 1.3 * r.stream_mb_s:
        r.findings.append(
            f"{_STREAMS} streams together reach {r.streams_mb_s:,.0f} MB/s against "
            f"{r.stream_mb_s:,.0f} MB/s for one: requests in flight together pay"
        )
    r.recommendations.append(f"num_workers={r.workers}")
    r.recommendations.append(
        f"sampler=packer.ShardedSampler(dataset, shuffle=True), not DataLoader(shuffle=True), "
        f"or cache_dir= (below): without the cache a scattered order is one GET per sample "
        f"(a shuffled batch took {r.shuffled_ms:.0f} ms, one in order {r.in_order_ms:.0f} ms)"
    )
    r.recommendations.append(
        f"prefetch={r.prefetch} (a shard of {format_size(r.shard_bytes)} takes "
        f"{1e3 * shard_s:.0f} ms to fetch and {1e3 * consume_s:.0f} ms to read)"
    )
    if fits:
        r.recommendations.append(
            f"cache_limit={format_size(r.cache_limit)} (the whole dataset: from the second "
            "epoch every read is local)"
        )
    else:
        r.recommendations.append(
            f"cache_limit={format_size(r.cache_limit)} (the dataset, "
            f"{format_size(r.dataset_bytes)}, does not fit the cache folder's free space; "
            "shards not cached are fetched again each epoch)"
        )


def doctor_remote(
    url: str,
    storage_options: dict[str, Any] | None = None,
    step_ms: float | None = None,
    batch_size: int = 64,
    probes: int = 12,
    cache_dir: str | None = None,
    seed: int = 0,
) -> RemoteReport:
    """Measure the store behind ``url`` and recommend loader and cache settings for it.

    Raises:
        PackerError: an unreadable URL, or bad arguments.
    """
    if batch_size < 1 or probes < 1 or (step_ms is not None and step_ms <= 0):
        raise PackerError("need batch_size >= 1, probes >= 1 and step_ms > 0")
    began = time.perf_counter()
    packed = open_packed(url, check_files=False, storage_options=dict(storage_options or {}))
    open_s = time.perf_counter() - began
    names, sizes = _files(packed)
    if not names:
        raise PackerError(f"{url!r} holds no data files to measure")
    n = len(packed.counts)
    report = RemoteReport(
        url, packed.manifest.format, n, int(packed.reader.length.sum()),
        int(statistics.median(sizes)), batch_size, step_ms, open_s=open_s,
    )  # fmt: skip
    folder: Any = packed.reader.remote  # type: ignore[attr-defined]
    report.latency_ms = _latency(folder, names, sizes, probes)
    report.stream_mb_s, report.streams_mb_s = _bandwidth(folder, names, sizes)
    size = min(batch_size, n)
    start = np.random.default_rng(seed).integers(0, n - size + 1)
    report.in_order_ms = _batch_ms(packed, np.arange(start, start + size))
    report.shuffled_ms = _batch_ms(packed, np.random.default_rng(seed + 1).permutation(n)[:size])
    report.cache_free_bytes = _free_bytes(cache_dir)
    _cache_state(report, packed.reader.url, names, cache_dir)  # type: ignore[attr-defined]
    _advise(report)
    packed.reader.close()
    report.elapsed_s = time.perf_counter() - began
    return report


def _cache_state(r: RemoteReport, url: str, names: list[str], cache_dir: str | None) -> None:
    """How much of the dataset the node-local cache holds: the hit rate the next epoch starts
    with (finished downloads only)."""
    wanted = {f"{url}/{name}" for name in names}
    held = [e for e in ShardCache(cache_dir).entries() if not e.partial and e.url in wanted]
    r.files, r.cached_files = len(names), len({e.url for e in held})
    r.cached_bytes = sum(e.bytes for e in held)
    share = r.cached_files / max(1, r.files)
    r.findings.append(
        f"the node-local cache ({cache_dir or default_cache_dir()}) holds {r.cached_files} of "
        f"{r.files} data files ({format_size(r.cached_bytes)}): {100 * share:.0f} % of shard "
        "reads would hit it now"
    )


def _free_bytes(cache_dir: str | None) -> int | None:
    """Free bytes of the file system the cache folder (or its nearest existing parent) is on."""
    folder = Path(cache_dir) if cache_dir else default_cache_dir()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def render(r: RemoteReport) -> str:
    """The report as text: measurements, findings, then the settings to use."""
    lines = [
        f"packer doctor: {r.url} ({r.format}, {r.samples:,} samples, "
        f"{format_size(r.dataset_bytes)}, shards ≈ {format_size(r.shard_bytes)}), batch "
        f"{r.batch_size}, measured in {r.elapsed_s:.1f} s",
        "",
        "store:",
        f"  open (manifest and tables, checked)   {1e3 * r.open_s:>9,.0f} ms",
        f"  latency of a {_PROBE // 1024} KiB ranged GET        {r.latency_median_ms:>9,.1f} ms "
        f"median, {r.latency_p90_ms:,.1f} ms p90 ({len(r.latency_ms)} requests)",
        f"  bandwidth, one stream                 {r.stream_mb_s:>9,.1f} MB/s",
        f"  bandwidth, {_STREAMS} streams together         {r.streams_mb_s:>9,.1f} MB/s",
        f"  a batch in order                      {r.in_order_ms:>9,.0f} ms",
        f"  a batch at random positions           {r.shuffled_ms:>9,.0f} ms",
        "",
        "findings:",
        *(f"  - {f}" for f in r.findings),
        "",
        "recommended:",
        *(f"  - {x}" for x in r.recommendations),
    ]
    return "\n".join(lines)
