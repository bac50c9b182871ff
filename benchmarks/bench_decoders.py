#!/usr/bin/env python
"""Decode speed of each installed JPEG decoder, and the fused crop against Pillow's pipeline.

Generates ``--images`` photo-like JPEGs (packer's demo generator) in memory, spread over
``--sizes``, then times in this one process (no DataLoader, no IO), the median of
``--repeats`` interleaved passes:

- ``decode <name>``: ``packer.decode.outputs.decode(data, "numpy", name)`` for each decoder;
- ``pillow decode + RandomResizedCrop``: full Pillow decode, then the Pillow training crop of
  ``packer.diagnosis.train_transform`` (torchvision's algorithm) to an array;
- ``fused RandomResizedCrop <name>``: :class:`packer.decode.transforms.RandomResizedCrop` on the bytes.

Usage::

    python benchmarks/bench_decoders.py --images 500 --sizes 400x350,640x480,1024x768
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from packer.bench.bench_report import markdown_table
from packer.decode.fast import available
from packer.decode.outputs import decode
from packer.decode.transforms import RandomResizedCrop
from packer.demo.image import photo_like
from packer.diagnosis.train_transform import DecodedRandomResizedCrop as PillowCrop

PILLOW_CROP = "pillow decode + RandomResizedCrop"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--images", type=int, default=500)
    p.add_argument("--sizes", default="400x350,640x480,1024x768")
    p.add_argument("--quality", type=int, default=90)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, default=Path("bench_decoders.json"))
    return p.parse_args(argv)


def make_jpegs(count: int, sizes: list[tuple[int, int]], quality: int) -> list[bytes]:
    """``count`` photo-like JPEGs, the sizes taken in turn."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        buffer = io.BytesIO()
        photo_like(rng, *sizes[i % len(sizes)]).save(buffer, format="JPEG", quality=quality)
        out.append(buffer.getvalue())
    return out


def pillow_crop(size: int) -> Callable[[bytes], Any]:
    crop = PillowCrop(size)
    return lambda data: np.asarray(crop(decode(data, "pil", "pillow")))


def main(args: argparse.Namespace) -> int:
    """Time every case and print the table (images/s, and the ratio to Pillow)."""
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    data = make_jpegs(args.images, sizes, args.quality)  # type: ignore[arg-type]
    names = ["pillow", *available()]
    cases: dict[str, Callable[[bytes], Any]] = {}
    for name in names:
        cases[f"decode {name}"] = lambda d, n=name: decode(d, "numpy", n)
    cases[PILLOW_CROP] = pillow_crop(args.crop)
    for name in names:
        cases[f"fused RandomResizedCrop {name}"] = RandomResizedCrop(
            args.crop, decoder=name, output="numpy"
        )
    times: dict[str, list[float]] = {case: [] for case in cases}
    torch.manual_seed(0)
    for _ in range(args.repeats):
        for case, fn in cases.items():
            start = time.perf_counter()
            for d in data:
                fn(d)
            times[case].append(len(data) / (time.perf_counter() - start))
    rates = {case: statistics.median(runs) for case, runs in times.items()}
    print(f"{len(data)} JPEGs of {args.sizes}, quality {args.quality}, one process")
    base = {
        case: rates["decode pillow" if case.startswith("decode") else PILLOW_CROP] for case in rates
    }
    cells = [[case, f"{rate:.0f}", f"{rate / base[case]:.2f}×"] for case, rate in rates.items()]
    print(markdown_table(["case", "images/s", "vs Pillow"], "lrr", cells))
    report = {
        "machine": platform.platform(),
        "python": sys.version.split()[0],
        "args": {k: str(v) for k, v in vars(args).items()},
        "images_per_s": rates,
    }
    args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
