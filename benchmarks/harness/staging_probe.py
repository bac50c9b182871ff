"""Upload alone, no conversion running: how fast the loopback link of
``benchmarks/staging_stream.py`` takes shard-sized objects one PUT at a time (what
``ShardStream`` did before it sent ``IN_FLIGHT`` shards at once), several objects at once
(``Uploader.put_many``, what the final upload of a whole staged output does), and one
object as a multipart upload with its parts in flight together (s3fs ``chunksize`` /
``max_concurrency``) — the candidates for keeping the link busy while converting.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from harness.host_load import own_usage
from packer.remote.storage import join_url
from packer.upload.journal import Journal
from packer.upload.uploader import Uploader

PART = 5 << 20  # S3's smallest part


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass


def _one_at_a_time(up: Uploader, files: list[Path], prefix: str) -> None:
    for path in files:
        up.put(path, f"{prefix}/{path.name}", _NoBar())


def _all_at_once(up: Uploader, files: list[Path], prefix: str) -> None:
    up.put_many([(p, f"{prefix}/{p.name}") for p in files], _NoBar())


def _multipart(up: Uploader, files: list[Path], prefix: str, parts: int = 4) -> None:
    fs = up.folder.fs()
    for path in files:
        url = join_url(up.url, f"{prefix}/{path.name}")
        fs.put_file(str(path), url, chunksize=PART, max_concurrency=parts)
        fs.invalidate_cache(url)
        fs.info(url)  # as Uploader.put checks the size


WAYS = {
    "one PUT at a time (the stream before 331f502)": _one_at_a_time,
    "8 PUTs at once (final upload; the stream now: 4)": _all_at_once,
    "one at a time, multipart 5 MiB x 4 in flight": _multipart,
}


def probe(store: Any, scratch: Path, shard_size: int, count: int) -> dict[str, Any]:
    """Upload ``count`` random files of ``shard_size`` bytes each way (:data:`WAYS`); per way
    the seconds, MB/s, this process's CPU seconds and the server's and proxy's."""
    folder = scratch / "probe"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    files = []
    for i in range(count):
        path = folder / f"shard-{i:05d}.bin"
        path.write_bytes(os.urandom(shard_size))
        files.append(path)
    url = f"s3://{store.bucket}/probe"
    options = {"endpoint_url": store.endpoint}
    out: dict[str, Any] = {}
    for k, (name, way) in enumerate(WAYS.items()):
        up = Uploader(url, options, Journal(folder / f"journal-{k}"), False)
        cpu0, store0 = own_usage()[0], store.cpu()
        started = time.perf_counter()
        way(up, files, f"w{k}")
        seconds = time.perf_counter() - started
        store1 = store.cpu()
        out[name] = {
            "seconds": seconds,
            "mb_per_s": count * shard_size / seconds / 1e6,
            "client_cpu_s": own_usage()[0] - cpu0,
            "store_cpu_s": {s: store1[s] - store0[s] for s in store1},
        }
        store.delete(list(store.objects(f"probe/w{k}")))
    shutil.rmtree(folder, ignore_errors=True)
    return out
