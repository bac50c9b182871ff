#!/usr/bin/env python
"""Local staging through the shard cache (issue 42 item 2): a cold epoch of an LMDB dataset on a
really throttled local disk, read in place and staged (``cache_dir=`` in ``/dev/shm``), and the
second epoch, side by side in one run.

The slow disk is real: an ext4 file system on a loop device whose reads are throttled by the
kernel's block layer (cgroup v1 ``blkio.throttle.read_bps_device``, or cgroup v2 ``io.max``),
for the processes of one cgroup. Every pass runs in a fresh child process moved into that
cgroup; the dataset's files are evicted from the page cache before a cold pass
(``POSIX_FADV_DONTNEED``); the cgroup's own counter of bytes read from the loop device
(``io_service_bytes``/``io.stat``) says what each epoch read from the disk, so a staged second
epoch that reads only the cache shows 0 bytes read from the source.

Passes (``--repeats`` rounds, interleaved; medians reported):

- ``in_place_cold``: ``open_dataset(src)``, one epoch in order, source evicted first;
- ``staged``: ``open_dataset(src, cache_dir=/dev/shm/...)`` on an empty cache, source evicted:
  the cold epoch (each shard copied into the cache, checked by its xxh3, on its first read),
  then the second and third epochs with the source evicted again (it must not matter);
- ``in_place_evicted_again``: the second epoch read in place when the page cache does not keep
  the source (a dataset larger than RAM, an NFS client cache): a cold epoch again;
- ``page_cache``: an epoch read in place by a fresh open with the source wholly in the page
  cache (the speed the staged second epoch is held to), and ``page_cache_again``: its next
  epoch (its maps then faulted in, as ``staged_third``'s are).

Needs root (loop device, mount, cgroup). Usage::

    python benchmarks/local_staging.py --rate-mb 20 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MOUNT = Path("/mnt/packer-local-staging")
V1 = Path("/sys/fs/cgroup/blkio")
V2 = Path("/sys/fs/cgroup")


def _run(*command: str) -> str:
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


class SlowDisk:
    """A loop device with ext4 mounted at :data:`MOUNT`, its reads throttled for one cgroup."""

    def __init__(self, size_mb: int, rate: int) -> None:
        self.image = Path(tempfile.mkdtemp(prefix="packer-slow-")) / "disk.img"
        with open(self.image, "wb") as handle:
            handle.truncate(size_mb << 20)
        self.device = _run("losetup", "-f", "--show", str(self.image))
        _run("mkfs.ext4", "-q", "-F", self.device)
        MOUNT.mkdir(parents=True, exist_ok=True)
        _run("mount", self.device, str(MOUNT))
        st = os.stat(self.device)
        self.major_minor = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}"
        self.v2 = not V1.is_dir()
        self.cgroup = (V2 if self.v2 else V1) / "packer_local_staging"
        self.cgroup.mkdir(exist_ok=True)
        if self.v2:
            (self.cgroup / "io.max").write_text(f"{self.major_minor} rbps={rate}\n")
            self.how = f"cgroup v2 io.max rbps={rate} on {self.device}"
        else:
            (self.cgroup / "blkio.throttle.read_bps_device").write_text(
                f"{self.major_minor} {rate}\n"
            )
            self.how = f"cgroup v1 blkio.throttle.read_bps_device {rate} B/s on {self.device}"

    def close(self) -> None:
        subprocess.run(["umount", str(MOUNT)], check=False)
        subprocess.run(["losetup", "-d", self.device], check=False)
        shutil.rmtree(self.image.parent, ignore_errors=True)
        try:
            self.cgroup.rmdir()
        except OSError:
            pass


def device_read_bytes(cgroup: Path, major_minor: str) -> int:
    """Bytes the processes of ``cgroup`` read from the device (the kernel's counter)."""
    if (cgroup / "io.stat").exists():
        for line in (cgroup / "io.stat").read_text().splitlines():
            if line.startswith(major_minor + " "):
                fields = dict(f.split("=") for f in line.split()[1:])
                return int(fields.get("rbytes", 0))
        return 0
    for line in (cgroup / "blkio.throttle.io_service_bytes").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == major_minor and parts[1] == "Read":
            return int(parts[2])
    return 0


def evict(folder: Path) -> None:
    for path in folder.iterdir():
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def epoch(dataset: Any, batch: int = 64) -> tuple[float, int]:
    """One in-order epoch of raw bytes: (seconds, bytes)."""
    began, total = time.perf_counter(), 0
    for start in range(0, len(dataset), batch):
        rows = dataset.__getitems__(list(range(start, min(start + batch, len(dataset)))))
        total += sum(len(data) for data, _ in rows)
    return time.perf_counter() - began, total


def child(args: argparse.Namespace) -> None:
    """One pass, in the throttled cgroup; prints its JSON."""
    import packer

    cgroup, src = Path(args.cgroup), Path(args.src)
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    out: dict[str, Any] = {}

    def timed(name: str, dataset: Any) -> None:
        before = device_read_bytes(cgroup, args.device)
        seconds, nbytes = epoch(dataset)
        out[name] = {
            "s": seconds,
            "bytes": nbytes,
            "device_read_bytes": device_read_bytes(cgroup, args.device) - before,
        }

    if args.mode == "page_cache":
        for path in src.iterdir():  # every file into the page cache, then a fresh open
            if path.is_file():
                path.read_bytes()
        dataset = packer.open_dataset(src, output="bytes")
        timed("page_cache", dataset)
        timed("page_cache_again", dataset)
    elif args.mode in ("in_place_cold", "in_place_evicted_again"):
        evict(src)
        timed(args.mode, packer.open_dataset(src, output="bytes"))
    else:
        from packer.remote.cache import wait_for_downloads

        shutil.rmtree(args.cache, ignore_errors=True)
        evict(src)
        dataset = packer.open_dataset(src, output="bytes", cache_dir=args.cache)
        timed("staged_cold", dataset)
        began = time.perf_counter()
        wait_for_downloads(600)  # a last shard's copy still going (read by range meanwhile)
        out["staged_cold"]["s_with_last_copies"] = (
            out["staged_cold"]["s"] + time.perf_counter() - began
        )
        evict(src)
        timed("staged_second", dataset)
        timed("staged_third", dataset)
    print(json.dumps(out))


def make_dataset(where: Path, samples: int) -> Path:
    import packer
    from packer.demo.image import make_image_tree

    tree = make_image_tree(
        where.parent / "jpegs", classes=4, per_class=samples // 4, size=(320, 240), bad=0
    )
    packer.convert(tree.root, where, shard_size="4MB", workers=1, progress=False)
    return where


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate-mb", type=float, default=20.0, help="read throttle, MB/s")
    parser.add_argument("--samples", type=int, default=2400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "local_staging.json"))
    parser.add_argument("--child", dest="mode", default=None)
    parser.add_argument("--src", default=None)
    for name in ("cgroup", "device", "cache"):
        parser.add_argument(f"--{name}-arg", dest=name, default=None)
    args = parser.parse_args()
    if args.mode:
        return child(args)
    if os.geteuid() != 0:
        sys.exit("needs root: a loop device, a mount and a cgroup make the slow disk")
    rate = int(args.rate_mb * 1e6)
    disk = SlowDisk(size_mb=max(256, args.samples // 8), rate=rate)
    cache = Path(f"/dev/shm/packer-local-staging-{os.getpid()}")
    try:
        src = make_dataset(MOUNT / "data" / "images.lmdb", args.samples)
        from packer.core.manifest import load_manifest

        manifest = load_manifest(src)
        shard_bytes = sum(s.bytes for s in manifest.shards)
        modes = ["in_place_cold", "staged", "in_place_evicted_again", "page_cache"]
        runs: dict[str, list[dict[str, Any]]] = {}
        for _ in range(args.repeats):
            for mode in modes:
                command = [sys.executable, __file__, "--child", mode, "--src", str(src)]
                command += ["--cgroup-arg", str(disk.cgroup), "--device-arg", disk.major_minor]
                command += ["--cache-arg", str(cache)]
                found = json.loads(_run(*command).splitlines()[-1])
                for name, value in found.items():
                    runs.setdefault(name, []).append(value)
        median = {
            name: {
                "s": statistics.median(r["s"] for r in rs),
                "device_read_mb": statistics.median(r["device_read_bytes"] for r in rs) / 1e6,
                "all_s": [round(r["s"], 3) for r in rs],
            }
            for name, rs in runs.items()
        }
        median["staged_cold"]["s_with_last_copies"] = statistics.median(
            r["s_with_last_copies"] for r in runs["staged_cold"]
        )
        cold = median["in_place_cold"]["s"]
        result = {
            "what": "one in-order epoch of raw bytes (output='bytes', batches of 64) of an LMDB "
            "dataset on a throttled ext4 loop device; staged = cache_dir in /dev/shm",
            "throttle": disk.how,
            "samples": manifest.num_samples,
            "shards": len(manifest.shards),
            "dataset_mb": shard_bytes / 1e6,
            "repeats": args.repeats,
            "cpus": os.cpu_count(),
            "median": median,
            "ratios": {
                "staged_cold_over_in_place_cold": median["staged_cold"]["s"] / cold,
                "staged_second_over_page_cache": median["staged_second"]["s"]
                / median["page_cache"]["s"],
                "staged_third_over_page_cache_again": median["staged_third"]["s"]
                / median["page_cache_again"]["s"],
                "in_place_evicted_again_over_staged_second": median["in_place_evicted_again"]["s"]
                / median["staged_second"]["s"],
                "source_mb_s_in_place_cold": shard_bytes / 1e6 / cold,
            },
        }
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        disk.close()


if __name__ == "__main__":
    main()
