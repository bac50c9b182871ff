"""What one ranged GET costs the reading process, by client: a random batch's records of the
NPY output fetched as byte ranges through s3fs (what packer uses: ``cat_ranges``, 10 pooled
connections by default, or 64) and through obstore (``get_ranges_async``, one call per shard,
its coalescing off), against the loopback store and proxy of ``benchmarks/remote.py``.

    PYTHONPATH=$PWD:$PWD/benchmarks /work/benchvenv/bin/python \\
        benchmarks/harness/remote_clients.py bench-data/n5000/remote-16MB/packer.npy

Prints, per client, wall milliseconds and process CPU milliseconds per batch and per GET.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import packer
from harness.remote_s3 import LoopbackStore

BATCHES = 12
BATCH = 64


def batches(reader: object, n: int) -> list[list[tuple[str, int, int]]]:
    """Random batches as (shard name, start, stop) of each record."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(BATCHES):
        recs = rng.choice(n, BATCH, replace=False)
        out.append(
            [
                (
                    reader.shard_names[int(reader.file[r])],  # type: ignore[attr-defined]
                    int(reader.offset[r]),  # type: ignore[attr-defined]
                    int(reader.offset[r] + reader.length[r]),  # type: ignore[attr-defined]
                )
                for r in recs
            ]
        )
    return out


def timed(name: str, fetch: Callable[[list[tuple[str, int, int]]], int], work: list) -> None:
    fetch(work[0])  # connections made, clients built
    wall, cpu = time.perf_counter(), time.process_time()
    got = sum(fetch(batch) for batch in work[1:])
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    gets = (len(work) - 1) * BATCH
    print(
        f"{name:28s} {wall / (len(work) - 1) * 1000:6.0f} ms/batch  "
        f"{cpu / gets * 1000:5.2f} CPU ms/GET  {got / wall / 1e6:6.1f} MB/s"
    )


def main(local: str) -> int:
    with tempfile.TemporaryDirectory() as tmp, LoopbackStore(20, 0, Path(tmp)) as store:
        url = store.upload(Path(local), "npy")
        ds = packer.open_dataset(url, storage_options={"endpoint_url": store.endpoint})
        work = batches(ds.reader, len(ds))
        for pool in (10, 64):
            import s3fs

            fs = s3fs.S3FileSystem(
                endpoint_url=store.endpoint,
                skip_instance_cache=True,
                config_kwargs={"max_pool_connections": pool},
            )

            def with_s3fs(batch: list, fs: object = fs) -> int:
                urls = [f"{url}/{name}" for name, _, _ in batch]
                blocks = fs.cat_ranges(urls, [a for _, a, _ in batch], [b for _, _, b in batch])  # type: ignore[attr-defined]
                return sum(len(b) for b in blocks)

            timed(f"s3fs cat_ranges, pool {pool}", with_s3fs, work)
        from obstore.store import S3Store

        obs = S3Store(
            store.bucket,
            config={
                "endpoint": store.endpoint,
                "region": "us-east-1",
                "access_key_id": "testing",
                "secret_access_key": "testing",
            },
            client_options={"allow_http": True},
        )
        import obstore

        async def per_shard(batch: list) -> int:
            shards: dict[str, list[tuple[int, int]]] = {}
            for name, a, b in batch:
                shards.setdefault(name, []).append((a, b))
            calls = [
                obstore.get_ranges_async(
                    obs, f"npy/{name}", starts=[a for a, _ in r], ends=[b for _, b in r], coalesce=0
                )
                for name, r in shards.items()
            ]
            return sum(len(b) for got in await asyncio.gather(*calls) for b in got)

        timed("obstore get_ranges_async", lambda batch: asyncio.run(per_shard(batch)), work)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
