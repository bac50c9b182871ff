"""One measured pass of ``benchmarks/remote.py``, in a process of its own (the peers keep global
state: LitData's and obstore's clients, MosaicML Streaming's shared memory):
``python remote_pass.py '<config JSON>'`` prints one JSON line.

A pass opens the dataset (timed: ``open_s``), then reads two epochs through
``DataLoader(num_workers, batch_size)``: the first with the cache folder empty (cold), the
second with it as the first epoch left it (warm; a reader without a cache reads the store
again). Each epoch records its seconds, the images it yielded, the proxy's counters over it
(the open's traffic is counted in the cold epoch's) and this process's CPU seconds with its
workers'.

Config keys: ``reader`` (``packer``, ``litdata``, ``mds``), ``source`` (URL or local path),
``endpoint`` (the proxy, or null for a local read), ``order`` (``sequential``, ``sharded``,
``random`` for packer; ``sequential``, ``shuffle`` for the peers), ``cache_dir`` (null: none),
``options`` (more keyword arguments of ``packer.open_dataset``), ``workers``, ``batch``.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import urllib.request
from typing import Any

from torch.utils.data import DataLoader, RandomSampler, SequentialSampler


def proxy_stats(endpoint: str | None) -> dict[str, int]:
    if endpoint is None:
        return {"requests": 0, "gets": 0, "body_bytes": 0, "head_bytes": 0}
    with urllib.request.urlopen(f"{endpoint}/__proxy__/stats", timeout=30) as r:
        return json.loads(r.read())


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers, once joined
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def keep(batch: list[Any]) -> list[Any]:
    return batch


def as_bytes(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


def keep_peer(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The batch as it is, but LitData's memoryviews made bytes (a worker's batch is pickled)."""
    return [{k: as_bytes(v) for k, v in item.items()} for item in batch]


def open_packer(cfg: dict[str, Any]) -> Any:
    import packer

    kwargs: dict[str, Any] = {"output": "bytes", **cfg.get("options", {})}
    if cfg["endpoint"] is not None:
        kwargs["storage_options"] = {
            "endpoint_url": cfg["endpoint"],
            **cfg.get("storage_options", {}),
        }
    if cfg.get("cache_dir"):
        kwargs["cache_dir"] = cfg["cache_dir"]
    return packer.open_dataset(cfg["source"], **kwargs)


def open_litdata(cfg: dict[str, Any]) -> Any:
    import litdata
    from litdata.streaming import downloader

    # LitData 0.2.76 prefetches chunks with obstore, whose client refuses an http:// endpoint
    # unless told (a real S3 endpoint is https): allow it in the client options LitData uses
    downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    return litdata.StreamingDataset(
        cfg["source"],
        cache_dir=cfg["cache_dir"],
        storage_options={"endpoint_url": cfg["endpoint"]},
        shuffle=cfg["order"] == "shuffle",
    )


def open_mds(cfg: dict[str, Any]) -> Any:
    from streaming import StreamingDataset

    os.environ["S3_ENDPOINT_URL"] = cfg["endpoint"]  # how Streaming takes an S3 endpoint
    dataset = StreamingDataset(
        remote=cfg["source"],
        local=cfg["cache_dir"],
        shuffle=cfg["order"] == "shuffle",
        batch_size=cfg["batch"],
    )
    # Streaming 0.13 keeps the boto3 client that fetched the index in the parent, and forked
    # workers inherit its open connection: two workers then read each other's responses (a hung
    # download, a corrupt shard). Its own clean_up() drops the client, so each worker makes one.
    for stream in dataset.streams:
        stream._downloader.clean_up()
    return dataset


OPENERS = {"packer": open_packer, "litdata": open_litdata, "mds": open_mds}


def loader(cfg: dict[str, Any], dataset: Any, epoch: int) -> DataLoader:
    sampler: Any = None
    if cfg["reader"] == "packer":
        if cfg["order"] == "sharded":
            import packer

            sampler = packer.ShardedSampler(dataset, seed=0)
            sampler.set_epoch(epoch)
        elif cfg["order"] == "random":
            sampler = RandomSampler(dataset)
        else:
            sampler = SequentialSampler(dataset)
    return DataLoader(
        dataset,
        batch_size=cfg["batch"],
        sampler=sampler,
        num_workers=cfg["workers"],
        collate_fn=keep if cfg["reader"] == "packer" else keep_peer,
        multiprocessing_context=cfg.get("context") if cfg["workers"] else None,
    )


def epoch(cfg: dict[str, Any], dataset: Any, number: int, before: dict[str, int]) -> dict:
    cpu = cpu_seconds()
    start = time.perf_counter()
    images, first = 0, None
    for batch in loader(cfg, dataset, number):
        images += len(batch)
        first = time.perf_counter() - start if first is None else first
    seconds = time.perf_counter() - start
    after = proxy_stats(cfg.get("stats", cfg["endpoint"]))
    return {
        "images": images,
        "seconds": seconds,
        "images_per_s": images / seconds,
        "first_batch_s": first,
        "cpu_s": cpu_seconds() - cpu,
        **{k: after[k] - before[k] for k in after},
    }, after


def main(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg["reader"] == "mds":
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()  # a previous pass's leftovers would block this one
    __import__({"packer": "packer", "litdata": "litdata", "mds": "streaming"}[cfg["reader"]])
    first = proxy_stats(cfg.get("stats", cfg["endpoint"]))
    start = time.perf_counter()
    dataset = OPENERS[cfg["reader"]](cfg)
    open_s = time.perf_counter() - start
    cold, mid = epoch(cfg, dataset, 0, first)
    warm, _ = epoch(cfg, dataset, 1, mid)
    return {"open_s": open_s, "cold": cold, "warm": warm}


if __name__ == "__main__":
    config = json.loads(sys.argv[1])
    print(json.dumps(main(config)), flush=True)
