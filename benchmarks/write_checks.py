#!/usr/bin/env python
"""What each ``check`` level of ``packer.Writer`` (``convert --check``) catches, and its cost
(issue 44 item 5: the Writer's default check).

Damage classes, each applied to ``--photos`` photo-like 400×350 JPEGs (quality 90, 6 baseline
and 2 progressive by default): ``truncated`` (cut at 19 lengths, the last 1-1000 bytes cut,
half cut and zero-filled), ``nonimage`` (text, HTML, random bytes, zeros, a JPEG start marker
then random bytes, an ``.npy``), ``header`` (one random byte changed before the scan data, ten
per photo; a forged frame size; the header zeroed) and ``scan`` (a marker written mid-scan,
1/10/100 random bytes changed in the scan data, a 4 kB sector zeroed, lost or randomised).

For each case: whether ``check_image`` at ``fast``, ``scan`` and ``decode`` refuses it, and
whether a reader fails on it (Pillow's full decode: the DataLoader worker's view). A check
"misses" a case a reader fails on and the check lets through. Then the CPU time of each check
on the intact photos. Writes ``results/write_checks.json``::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/write_checks.py
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from harness.damage import corrupted_scan, patched_frame_header
from PIL import Image

from packer.decode.check import CHECKS, check_image
from packer.demo.image import photo_like
from packer.errors import InputFileError


def _encoded(image: Image.Image, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90, **options)
    return out.getvalue()


def photos(count: int, seed: int = 0) -> list[bytes]:
    """``count`` photos, a quarter of them progressive."""
    rng = np.random.default_rng(seed)
    progressive = count // 4
    return [
        _encoded(photo_like(rng, 400, 350), progressive=i >= count - progressive)
        for i in range(count)
    ]


def _scan_start(data: bytes) -> int:
    at = data.index(b"\xff\xda")
    return at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")


def cases(photo_set: list[bytes], seed: int = 1) -> Iterator[tuple[str, bytes]]:
    """(damage class, bytes) for every damaged case of every photo."""
    rng = np.random.default_rng(seed)
    for data in photo_set:
        n, scan = len(data), _scan_start(data)
        for k in range(1, 20):
            yield "truncated", data[: n * k // 20]
        for cut in (1, 2, 10, 100, 1000):
            yield "truncated", data[:-cut]
        yield "truncated", data[: n // 2] + bytes(n - n // 2)
        npy = io.BytesIO()
        np.save(npy, np.zeros(10))
        for other in (b"a cat on a mat", b"<html><body>404 Not Found</body></html>",
                      rng.bytes(n), bytes(n), b"\xff\xd8" + rng.bytes(n), npy.getvalue()):  # fmt: skip
            yield "nonimage", other
        for _ in range(10):
            changed = bytearray(data)
            at = int(rng.integers(2, scan))
            changed[at] ^= int(rng.integers(1, 256))
            yield "header", bytes(changed)
        yield "header", patched_frame_header(data, size=(4000, 3000))
        yield "header", data[:2] + bytes(scan - 2) + data[scan:]
        yield "scan", corrupted_scan(data)
        for flips in (1, 10, 100):
            changed = bytearray(data)
            for _ in range(flips):
                at = int(rng.integers(scan, n - 2))
                changed[at] ^= int(rng.integers(1, 256))
            yield "scan", bytes(changed)
        half = n // 2
        yield "scan", data[:half] + bytes(4096) + data[half + 4096 :]
        yield "scan", data[:half] + data[half + 4096 :]
        yield "scan", data[:half] + rng.bytes(4096) + data[half + 4096 :]


def refused(check: str, data: bytes) -> bool:
    try:
        check_image(data, check)
    except InputFileError:
        return True
    return False


def reader_fails(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except Exception:  # noqa: BLE001 - whatever a reader raises, it fails
        return True
    return False


def measure(photo_set: list[bytes], repeats: int) -> dict[str, Any]:
    """Per damage class: cases, reader failures, and each check's catches and misses; then
    each check's CPU ms per intact photo (median of ``repeats``)."""
    table: dict[str, dict[str, int]] = {}
    for kind, data in cases(photo_set):
        row = table.setdefault(kind, {"cases": 0, "reader_fails": 0})
        fails = reader_fails(data)
        row["cases"] += 1
        row["reader_fails"] += fails
        for check in CHECKS:
            caught = refused(check, data)
            row[f"{check}_catches"] = row.get(f"{check}_catches", 0) + caught
            row[f"{check}_misses"] = row.get(f"{check}_misses", 0) + (fails and not caught)
    cost = {}
    for check in CHECKS:
        times = []
        for _ in range(repeats):
            start = time.process_time()
            for data in photo_set:
                check_image(data, check)
            times.append((time.process_time() - start) / len(photo_set) * 1e3)
        cost[check] = sorted(times)[len(times) // 2]
    return {"damage": table, "cpu_ms_per_photo": cost}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--photos", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    report = {"benchmark": "write_checks", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "photos": args.photos, **measure(photos(args.photos), args.repeats)}  # fmt: skip
    print(
        "| damage | cases | a reader fails | "
        + " | ".join(f"{c} catches (misses)" for c in CHECKS)
        + " |"
    )
    print("|---|--:|--:|" + "--:|" * len(CHECKS))
    for kind, row in report["damage"].items():
        cells = " | ".join(f"{row[f'{c}_catches']} ({row[f'{c}_misses']})" for c in CHECKS)
        print(f"| {kind} | {row['cases']} | {row['reader_fails']} | {cells} |")
    print(
        "CPU ms per intact photo:", {c: round(v, 3) for c, v in report["cpu_ms_per_photo"].items()}
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "write_checks.json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
