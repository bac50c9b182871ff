"""Opt-in (``PACKER_TEST_CPU=<folder>``): each test's CPU-seconds (user + sys of the test process
and of the children it reaped, setup and teardown included) written per xdist worker to
``<folder>/<worker>.tsv``; ``python tests/cpu_report.py <folder>`` sums them per file."""

from __future__ import annotations

import os
import resource
import sys
from collections import defaultdict
from pathlib import Path

import pytest


def _cpu() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    start = _cpu()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(os.environ["PACKER_TEST_CPU"]) / f"{worker}.tsv", "a") as out:
        out.write(f"{item.nodeid}\t{_cpu() - start:.3f}\n")


def main(folder: str) -> None:
    per_file: dict[str, float] = defaultdict(float)
    per_test = []
    for path in Path(folder).glob("*.tsv"):
        for line in path.read_text().splitlines():
            nodeid, cpu = line.rsplit("\t", 1)
            per_file[nodeid.split("::")[0]] += float(cpu)
            per_test.append((float(cpu), nodeid))
    print(f"total {sum(per_file.values()):.1f} CPU-s in {len(per_test)} tests")
    for name, cpu in sorted(per_file.items(), key=lambda kv: -kv[1])[:40]:
        print(f"{cpu:8.1f}  {name}")
    print()
    for cpu, nodeid in sorted(per_test, reverse=True)[:50]:
        print(f"{cpu:8.1f}  {nodeid}")


if __name__ == "__main__":
    main(sys.argv[1])
