"""One measured conversion of ``benchmarks/staging_stream.py``: to the loopback S3 store
streamed (``convert_to_url``'s default), whole-staged (``keep_staging=True``) or locally
(``packer.convert``), with the disk blocks held under its staging folder polled in a thread,
sampled at each conversion event, and where the time goes.

Where the time goes is read by timing a few packer methods from outside (wrapped for the run,
restored after; packer's code is not changed): the converter blocked in
``ShardStream.after_shard`` (waiting while ``staging_limit`` bytes wait for upload) and in
``drain`` (before the tables), the upload threads busy in ``ShardStream._send`` (summed over
the up to ``IN_FLIGHT`` shards sent at once), and the final ``Uploader.upload``.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import packer
from harness.host_load import host_busy_seconds, others_during, own_usage
from harness.remote_s3 import CREDENTIALS, HERE, LoopbackStore, _start
from packer.upload.staging import convert_to_url
from packer.upload.stream import ShardStream
from packer.upload.uploader import Uploader

# streamed: convert_to_url's default (up to IN_FLIGHT shards sent at once); whole:
# keep_staging=True; local: packer.convert
MODES = ("streamed", "whole", "local")


def blocks_under(folder: Path) -> int:
    """Bytes of disk blocks (``st_blocks * 512``) of the files under ``folder`` now (a file
    removed while it is counted counts 0)."""
    total = 0
    for top, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


class DiskPoll:
    """A thread sampling :func:`blocks_under` every ``interval`` seconds; ``peak`` is the most
    seen, ``samples`` how many samples were taken. A context manager."""

    def __init__(self, folder: Path, interval: float = 0.05) -> None:
        self.folder, self.interval = folder, interval
        self.peak = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="disk-poll", daemon=True)

    def __enter__(self) -> DiskPoll:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, blocks_under(self.folder))
            self.samples += 1
            self._stop.wait(self.interval)


class Timings:
    """Seconds spent in wrapped methods (any thread), how many calls, and the most calls of
    each running at once (the shards the stream had in flight, for ``_send``)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.most_at_once: dict[str, int] = {}
        self._running: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, key: str) -> None:
        with self._lock:
            self._running[key] = self._running.get(key, 0) + 1
            self.most_at_once[key] = max(self.most_at_once.get(key, 0), self._running[key])

    def add(self, key: str, seconds: float) -> None:
        with self._lock:
            self._running[key] -= 1
            self.seconds[key] = self.seconds.get(key, 0.0) + seconds
            self.calls[key] = self.calls.get(key, 0) + 1


# (class, method, key): the packer methods timed during a run
TIMED = (
    (ShardStream, "after_shard", "convert_blocked_after_shard"),
    (ShardStream, "drain", "convert_blocked_drain"),
    (ShardStream, "_send", "upload_thread_busy"),
    (Uploader, "upload", "final_upload"),
)


@contextmanager
def timed_methods(timings: Timings) -> Iterator[None]:
    """Wrap each of :data:`TIMED` to add its seconds to ``timings``; restore them after."""
    saved = [(cls, name, cls.__dict__[name]) for cls, name, _ in TIMED]

    def wrap(orig: Callable[..., Any], key: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            timings.enter(key)
            start = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                timings.add(key, time.perf_counter() - start)

        return timed

    for cls, name, key in TIMED:
        setattr(cls, name, wrap(getattr(cls, name), key))
    try:
        yield
    finally:
        for cls, name, orig in saved:
            setattr(cls, name, orig)


class EventLog:
    """The conversion's ``on_event``: the time of each shard / tables / manifest event and the
    staging blocks at that moment (not at every sample: that is the poll's job)."""

    def __init__(self, folder: Path, started: float) -> None:
        self.folder, self.started = folder, started
        self.peak, self.shards = 0, 0
        self.first: dict[str, float] = {}

    def __call__(self, name: str, number: int) -> None:
        if name == "sample":
            return
        now = time.perf_counter() - self.started
        self.first.setdefault(name, now)
        self.shards += name == "shard"
        self.peak = max(self.peak, blocks_under(self.folder))


class StagingStore(LoopbackStore):
    """moto's S3 server behind :mod:`harness.staging_proxy` (uploads capped as well)."""

    def __init__(self, latency_ms: float, bandwidth_mbps: float, root: Path) -> None:
        super().__init__(latency_ms, bandwidth_mbps, root, server="moto")

    def _start(self) -> StagingStore:
        os.environ.update(CREDENTIALS)
        server, port = _start([sys.executable, str(HERE / "remote_s3.py")])
        self.procs.append(server)
        self.direct = f"http://127.0.0.1:{port}"
        proxy, pport = _start(
            [
                sys.executable,
                str(HERE / "staging_proxy.py"),
                f"--upstream={self.direct}",
                f"--latency-ms={self.latency_ms}",
                f"--bandwidth-mbps={self.bandwidth_mbps}",
            ]
        )
        self.procs.append(proxy)
        self.endpoint = f"http://127.0.0.1:{pport}"
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def objects(self, prefix: str) -> dict[str, int]:
        """Each object's size under ``prefix/`` (straight from the server)."""
        client, out, token = self.client(), {}, None
        while True:
            more = {"ContinuationToken": token} if token else {}
            page = client.list_objects_v2(Bucket=self.bucket, Prefix=prefix + "/", **more)
            out.update({o["Key"]: o["Size"] for o in page.get("Contents", [])})
            token = page.get("NextContinuationToken")
            if not token:
                return out

    def delete(self, keys: list[str]) -> None:
        client = self.client()
        for i in range(0, len(keys), 1000):
            chunk = [{"Key": k} for k in keys[i : i + 1000]]
            client.delete_objects(Bucket=self.bucket, Delete={"Objects": chunk})


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def convert_once(
    mode: str, src: Path, suffix: str, store: StagingStore, scratch: Path, options: dict[str, Any]
) -> dict[str, Any]:
    """One conversion of ``src`` in ``mode`` (:data:`MODES`) with ``options`` (shard_size,
    staging_limit); its figures. The destination and the staging folder are emptied after."""
    staging = scratch / f"staging-{mode}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    prefix = f"{mode}{suffix}"
    url = f"s3://{store.bucket}/{prefix}"
    timings = Timings()
    store.reset()
    cpu0, host0 = own_usage()[0], host_busy_seconds()
    started = time.perf_counter()
    events = EventLog(staging, started)
    common = dict(shard_size=options["shard_size"], progress=False, on_event=events)
    with DiskPoll(staging) as poll, timed_methods(timings):
        if mode == "local":
            result = packer.convert(src, staging / f"out{suffix}", **common)
        else:
            result = convert_to_url(
                src,
                url,
                storage_options={"endpoint_url": store.endpoint},
                staging=staging,
                keep_staging=mode == "whole",
                staging_limit=options["staging_limit"],
                **common,
            )
        wall = time.perf_counter() - started
    cpu = own_usage()[0] - cpu0
    link = store.stats()
    if mode == "local":
        output = tree_bytes(staging / f"out{suffix}")
    else:
        objects = store.objects(prefix)
        output = sum(objects.values())
        store.delete(list(objects))
    shutil.rmtree(staging, ignore_errors=True)
    peak = max(poll.peak, events.peak)
    return {
        "mode": mode,
        "wall_s": wall,
        "peak_staging_bytes": peak,
        "peak_staging_poll_bytes": poll.peak,
        "peak_staging_event_bytes": events.peak,
        "poll_samples": poll.samples,
        "output_bytes": output,
        "peak_over_output": peak / output if output else None,
        "sent_bytes": link["sent_bytes"],
        "requests": link["requests"],
        "puts": link["puts"],
        "samples": result.manifest.num_samples if result.manifest is not None else None,
        "shards": events.shards,
        "events_s": events.first,
        "timings_s": timings.seconds,
        "timings_calls": timings.calls,
        "timings_most_at_once": timings.most_at_once,
        "cpu_s": cpu,
        "others_share": others_during(host0, host_busy_seconds(), cpu, wall),
        "notes": list(result.notes),
    }
