#!/usr/bin/env python
"""packer against ``datasets`` itself on a Parquet of photos with embedded bytes (issue 45 item 4).

Data: ``--photos`` photo-like 400x350 JPEGs (quality 90, the generator of the other benchmarks'
photos, 10 classes) written by the real ``datasets`` library (``Dataset.from_dict`` with an
``Image`` and a ``ClassLabel`` feature, ``to_parquet``). packer converts it (``packer.convert``,
the default check); ``datasets`` loads it (``load_dataset("parquet", ...)``, which prepares its
own Arrow cache: timed as its conversion). Then, in one run, rounds of one pass of each side
(the order flipped every other round, each pass in a freshly forked child, one warm-up pass
each), ``DataLoader(num_workers=2, batch_size=64)`` to 224x224 uint8 tensors and labels:

- ``same_transform``: both sides hand the encoded bytes to the same function, packer's fused
  ``RandomResizedCrop(224)`` (``datasets``: ``Image(decode=False)``, ``with_format("torch")``;
  packer: ``output="bytes"``), applied in the loader's workers: only the storage path differs;
- ``decoded``: both sides decode the whole image (``datasets``: ``with_format("torch")``, its
  PIL decode; packer: ``output="numpy"``) and apply one PIL crop-and-resize (torchvision's
  RandomResizedCrop parameters, bilinear) to the pixels;
- ``packer_fused``: packer as its docs say to read it (``transform=RandomResizedCrop(224)``,
  decoding only what the crop needs) against ``decoded``'s ``datasets`` pipeline.

Each ratio is packer's samples/s over ``datasets``' within a round: reported as the median of
the rounds with their spread (min, max). ``--rss-gb`` measures the peak RSS of ``packer
convert`` on Parquet files of those sizes (the same JPEGs repeated, written with pyarrow with the
schema and row groups ``datasets`` gives an image table), the process tree's sum sampled every
20 ms: memory bounded by a row group shows as a peak that stays flat while the file grows.
torchvision is never imported.

    python benchmarks/hf_read.py                      # 5000 photos, 5 rounds, RSS at 0.5 and 2 GB
    python benchmarks/hf_read.py --quick              # 500 photos, 2 rounds, RSS at 0.1 and 0.3 GB
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness.forked import in_child
from harness.record import report_head, save_report, stamped_log

CLASSES = [f"class{i}" for i in range(10)]
SIZE = 224
log = stamped_log(time.perf_counter())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--data", type=Path, default=Path("/work/bench-hf"))
    parser.add_argument(
        "--rss-gb", default="0.5,2", help="Parquet sizes for the RSS runs ('': none)"
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rss-only", action="store_true", help="Only the RSS runs (into --json).")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results/hf_read.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.photos, args.rounds, args.rss_gb = 500, 2, "0.1,0.3"
    return args


def photos(count: int) -> list[bytes]:
    from packer.demo.image import photo_like

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        buffer = io.BytesIO()
        photo_like(rng, 400, 350).save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def make_parquet(work: Path, count: int) -> tuple[Path, list[bytes]]:
    """``work/photos.parquet`` written by ``datasets`` (made once per count)."""
    import datasets
    import pyarrow.parquet as pq

    path = work / f"photos-{count}.parquet"
    if path.is_file():  # its JPEGs, as datasets stored them
        cells = pq.read_table(path, columns=["image"]).column("image").to_pylist()
        return path, [cell["bytes"] for cell in cells]
    jpegs = photos(count)
    if not path.is_file():
        features = datasets.Features(
            {"image": datasets.Image(), "label": datasets.ClassLabel(names=CLASSES)}
        )
        rows = {
            "image": [{"bytes": b, "path": None} for b in jpegs],
            "label": [i % len(CLASSES) for i in range(count)],
        }
        datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path, jpegs


def rrc_pixels(pixels: np.ndarray) -> Any:
    """torchvision's RandomResizedCrop(224) on decoded HxWx3 pixels, by PIL (bilinear): the
    crop both sides of ``decoded`` apply."""
    import torch
    from PIL import Image

    from packer.decode.transforms import crop_params

    height, width = pixels.shape[:2]
    top, left, h, w = crop_params(width, height, (0.08, 1.0), (3 / 4, 4 / 3))
    image = Image.fromarray(pixels).resize(
        (SIZE, SIZE), Image.BILINEAR, box=(left, top, left + w, top + h)
    )
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


class Collate:
    """A batch of ``(value, label)`` into stacked 224x224 tensors, in the loader's workers:
    ``how`` is ``bytes`` (packer's fused crop on encoded bytes) or ``pixels`` (:func:`rrc_pixels`),
    ``hf`` whether the items are ``datasets``' dicts."""

    def __init__(self, how: str, hf: bool) -> None:
        self.how, self.hf = how, hf
        self.crop: Any = None

    def __call__(self, batch: list[Any]) -> Any:
        import torch

        if self.crop is None and self.how == "bytes":
            from packer.transforms import RandomResizedCrop

            self.crop = RandomResizedCrop(SIZE)
        images, labels = [], []
        for item in batch:
            if self.hf:
                value, label = item["image"], int(item["label"])
                value = value["bytes"] if self.how == "bytes" else value.permute(1, 2, 0).numpy()
            else:
                value, label = item
            images.append(self.crop(value) if self.how == "bytes" else rrc_pixels(value))
            labels.append(label)
        return torch.stack(images), torch.tensor(labels)


def one_pass(cfg: dict[str, Any]) -> dict[str, Any]:
    """One epoch of one side's loader (in a forked child): samples/s and a checksum of labels."""
    import torch

    if cfg["side"] == "hf":
        import datasets

        ds = datasets.load_dataset(
            "parquet", data_files=cfg["parquet"], split="train", cache_dir=cfg["cache"]
        )
        if cfg["how"] == "bytes":
            ds = ds.cast_column("image", datasets.Image(decode=False))
        ds = ds.with_format("torch")
        collate: Any = Collate(cfg["how"], hf=True)
    else:
        import packer

        if cfg["how"] == "fused":
            from packer.transforms import RandomResizedCrop

            ds = packer.open_dataset(cfg["lmdb"], output="bytes", transform=RandomResizedCrop(SIZE))
            collate = None
        else:
            output = "bytes" if cfg["how"] == "bytes" else "numpy"
            ds = packer.open_dataset(cfg["lmdb"], output=output)
            collate = Collate(cfg["how"], hf=False)
    loader = torch.utils.data.DataLoader(
        ds,
        batch_size=cfg["batch"],
        num_workers=cfg["workers"],
        collate_fn=collate,
        persistent_workers=False,
    )
    start, cpu0 = time.perf_counter(), os.times()
    seen, total = 0, 0
    for images, labels in loader:
        assert images.shape[1:] == (3, SIZE, SIZE) and images.dtype == torch.uint8
        seen += len(labels)
        total += int(labels.sum())
    seconds, cpu1 = time.perf_counter() - start, os.times()
    cpu = (cpu1.user - cpu0.user) + (cpu1.children_user - cpu0.children_user)
    return {"samples": seen, "label_sum": total, "seconds": seconds, "cpu_main": cpu}


SIDES = {  # variant: (packer's how, datasets' how)
    "same_transform": ("bytes", "bytes"),
    "decoded": ("pixels", "pixels"),
    "packer_fused": ("fused", "pixels"),
}


def read_rounds(args: argparse.Namespace, parquet: Path, lmdb: Path, cache: Path) -> dict:
    base = {"parquet": str(parquet), "lmdb": str(lmdb), "cache": str(cache)}
    base |= {"batch": args.batch, "workers": args.workers}
    expected = sum(i % len(CLASSES) for i in range(args.photos))
    out: dict[str, Any] = {}
    for variant, (mine, theirs) in SIDES.items():
        cfgs = {"packer": {**base, "side": "packer", "how": mine}}
        cfgs["datasets"] = {**base, "side": "hf", "how": theirs}
        for cfg in cfgs.values():
            in_child(one_pass, cfg)  # warm-up: page cache, datasets' cache files
        rates: dict[str, list[float]] = {"packer": [], "datasets": []}
        ratios = []
        for r in range(args.rounds):
            order = list(cfgs) if r % 2 == 0 else list(reversed(cfgs))
            got = {}
            for side in order:
                ok = in_child(one_pass, cfgs[side])
                assert ok["samples"] == args.photos and ok["label_sum"] == expected, ok
                got[side] = ok["samples"] / ok["seconds"]
                rates[side].append(got[side])
            ratios.append(got["packer"] / got["datasets"])
            log(
                f"{variant} round {r}: packer {got['packer']:.0f}/s, datasets "
                f"{got['datasets']:.0f}/s, ratio {ratios[-1]:.2f}"
            )
        out[variant] = {
            "packer_samples_per_s": rates["packer"],
            "datasets_samples_per_s": rates["datasets"],
            "ratios": ratios,
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    return out


def big_parquet(work: Path, jpegs: list[bytes], gigabytes: float, template: Path) -> Path:
    """A Parquet of about ``gigabytes`` of the JPEGs repeated, in row groups of 100 (as
    ``datasets`` writes an image table), with ``template``'s schema (its features)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = work / f"big-{gigabytes:g}GB.parquet"
    if path.is_file():
        return path
    schema = pq.read_schema(template)
    target, written, i = int(gigabytes * 1e9), 0, 0
    with pq.ParquetWriter(str(path), schema) as out:
        while written < target:
            chunk = [jpegs[(i + k) % len(jpegs)] for k in range(100)]
            images = pa.array(
                [{"bytes": b, "path": None} for b in chunk], type=schema.field("image").type
            )
            labels = pa.array([(i + k) % len(CLASSES) for k in range(100)], pa.int64())
            out.write_table(pa.Table.from_arrays([images, labels], schema=schema))
            written += sum(len(b) for b in chunk)
            i += 100
    return path


def _rss(pid: int) -> tuple[int, int]:
    """``(anonymous, file-backed)`` resident bytes of ``pid`` (/proc/PID/status: RssAnon;
    RssFile + RssShmem): the LMDB output's written pages are file-backed, the heap anonymous."""
    anon = file = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith(("RssFile:", "RssShmem:")):
                file += int(line.split()[1]) * 1024
    return anon, file


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return out


def convert_rss(src: Path, dst: Path) -> dict[str, Any]:
    """Peak RSS of ``packer convert``: anonymous and in all, of the main process and of the
    process tree summed (the main process and its workers)."""
    shutil.rmtree(dst, ignore_errors=True)
    cli = Path(sys.executable).with_name("packer")
    start = time.perf_counter()
    proc = subprocess.Popen(
        [str(cli), "convert", str(src), str(dst), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    peaks = {"tree_anon": 0, "tree_total": 0, "main_anon": 0, "main_total": 0}
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            anon = total = 0
            for p in _tree(proc.pid):
                try:
                    a, f = _rss(p)
                except OSError:
                    continue
                anon, total = anon + a, total + a + f
                if p == proc.pid:
                    peaks["main_anon"] = max(peaks["main_anon"], a)
                    peaks["main_total"] = max(peaks["main_total"], a + f)
            peaks["tree_anon"] = max(peaks["tree_anon"], anon)
            peaks["tree_total"] = max(peaks["tree_total"], total)
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    output = proc.communicate()[0]
    done.set()
    thread.join()
    if proc.returncode != 0:
        raise SystemExit(f"packer convert {src} failed:\n{output}")
    manifest = json.loads((dst / "packer.json").read_text())
    return {
        "parquet_bytes": src.stat().st_size,
        "samples": manifest["num_samples"],
        "seconds": time.perf_counter() - start,
        **{f"peak_rss_{k}_mb": v / 1e6 for k, v in peaks.items()},
    }


def rss_runs(
    args: argparse.Namespace, report: dict, work: Path, jpegs: list[bytes], parquet: Path
) -> dict:
    """The RSS runs of ``--rss-gb`` into ``report``, which is saved."""
    report["rss"] = []
    for size in [float(s) for s in args.rss_gb.split(",") if s]:
        big = big_parquet(work, jpegs, size, parquet)
        log(f"converting {big} ({big.stat().st_size / 1e9:.2f} GB), sampling RSS ...")
        report["rss"].append(convert_rss(big, work / "big.lmdb"))
        log(json.dumps(report["rss"][-1]))
    shutil.rmtree(work / "big.lmdb", ignore_errors=True)
    save_report(args.json, report)
    return report


def main(args: argparse.Namespace) -> dict[str, Any]:
    import packer

    work = args.data
    work.mkdir(parents=True, exist_ok=True)
    log(f"making the Parquet of {args.photos} photos with datasets in {work} ...")
    parquet, jpegs = make_parquet(work, args.photos)
    if args.rss_only:  # the RSS runs again, into the JSON of an earlier run
        report = json.loads(args.json.read_text())
        report["rss_command"] = " ".join([sys.executable, *sys.argv])
        return rss_runs(args, report, work, jpegs, parquet)
    report = report_head("hf_read", {"cpus": os.cpu_count()}, args)
    lmdb = work / f"photos-{args.photos}.lmdb"
    start = time.perf_counter()
    packer.convert(parquet, lmdb, overwrite=True, progress=False)
    report["convert_seconds"] = {"packer convert (check scan)": time.perf_counter() - start}
    cache = work / f"hf-cache-{args.photos}"
    shutil.rmtree(cache, ignore_errors=True)
    start = time.perf_counter()
    in_child(
        one_pass,
        {
            "side": "hf",
            "how": "bytes",
            "parquet": str(parquet),
            "cache": str(cache),
            "batch": args.batch,
            "workers": 0,
        },
    )
    report["convert_seconds"]["datasets load_dataset + one pass, workers=0"] = (
        time.perf_counter() - start
    )
    log("reading side by side ...")
    report["read"] = read_rounds(args, parquet, lmdb, cache)
    save_report(args.json, report)
    for variant, got in report["read"].items():
        print(
            f"{variant}: packer/datasets median {got['ratio_median']:.2f}x "
            f"(min {got['ratio_min']:.2f}, max {got['ratio_max']:.2f})"
        )
    return rss_runs(args, report, work, jpegs, parquet)


if __name__ == "__main__":
    main(parse_args())
