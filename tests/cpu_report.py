"""Opt-in (``PACKER_TEST_CPU=<folder>``): where the suite's CPU-seconds go.

Each test process (xdist worker) appends JSON lines to ``<folder>/<worker>.jsonl``:

- ``{"test": nodeid, "cpu": s, "wall": s, "setup": s, "call": s, "teardown": s}`` per test: user +
  sys of the test process, of the children it reaped and of the forkserver's (its DataLoader
  workers are the forkserver's children, reaped there: counted in this process only when the
  forkserver stops), setup and teardown included, and the CPU of each phase;
- ``{"fixture": name, "scope": s, "test": nodeid, "cpu": s, "wall": s}`` per fixture set up (its own
  function only: the fixtures it requests are set up before it, each with a line of its own);
- ``{"process": worker, "cpu": s, "self": s, "wall": s}`` once at the end: the process's whole
  CPU (``self``: without its children's), the start (imports, the forkserver's) and end included.

``python tests/cpu_report.py <folder>`` ranks the tests and sums them by file and by fixture.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from multiprocessing import forkserver
from pathlib import Path
from typing import Any

import pytest

_TICK = os.sysconf("SC_CLK_TCK")
_fixtures: list[dict[str, Any]] = []
_phases: dict[str, float] = {}


def _forkserver_cpu() -> float:
    """The forkserver's CPU and its reaped children's (fields 14-17 of /proc/<pid>/stat)."""
    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if not pid:
        return 0.0
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return sum(int(v) for v in fields[11:15]) / _TICK


def _cpu() -> float:
    total = _forkserver_cpu()
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def _write(record: dict[str, Any]) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = Path(os.environ["PACKER_TEST_CPU"])
    folder.mkdir(parents=True, exist_ok=True)  # the first record makes it
    with open(folder / f"{worker}.jsonl", "a") as out:
        out.write(json.dumps(record) + "\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _fixtures.clear()
    _phases.clear()
    start, wall = _cpu(), time.monotonic()
    yield
    record = {"test": item.nodeid, "cpu": round(_cpu() - start, 3)}
    record["wall"] = round(time.monotonic() - wall, 3)
    record.update({k: round(v, 3) for k, v in _phases.items()})
    _write(record)
    for fixture in _fixtures:
        _write({**fixture, "test": item.nodeid})


def _phase(name: str) -> Iterator[None]:
    start = _cpu()
    yield
    _phases[name] = _cpu() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    yield from _phase("setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    yield from _phase("call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    yield from _phase("teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Iterator[None]:
    start, wall = _cpu(), time.monotonic()
    yield
    cpu = _cpu() - start
    if cpu >= 0.005:
        _fixtures.append(
            {
                "fixture": fixturedef.argname,
                "scope": fixturedef.scope,
                "where": fixturedef.baseid or "(plugin)",
                "cpu": round(cpu, 3),
                "wall": round(time.monotonic() - wall, 3),
            }
        )


_START = time.monotonic()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After conftest's own (it stops the forkserver, whose CPU is then this process's). The
    xdist controller's children are its workers: its own CPU is ``self``."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    _write(
        {
            "process": os.environ.get("PYTEST_XDIST_WORKER", "main"),
            "cpu": round(_cpu(), 3),
            "self": round(own.ru_utime + own.ru_stime, 3),
            "wall": round(time.monotonic() - _START, 3),
        }
    )


def main(folder: str, top: int = 50) -> None:
    tests, fixtures, processes = [], [], []
    for path in Path(folder).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "fixture" in record:
                fixtures.append(record)
            elif "process" in record:
                processes.append(record)
            else:
                tests.append(record)
    in_tests = sum(t["cpu"] for t in tests)
    workers = [p for p in processes if p["process"] != "main"]
    whole = sum(p["cpu"] for p in workers) + sum(
        p["self" if workers else "cpu"] for p in processes if p["process"] == "main"
    )
    print(f"{len(tests)} tests: {in_tests:.1f} CPU-s in tests, {whole:.1f} CPU-s in the test")
    print(f"processes ({len(processes)}), {whole - in_tests:.1f} outside the tests")
    per_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for t in tests:
        entry = per_file[t["test"].split("::")[0]]
        entry[0] += t["cpu"]
        entry[1] += 1
    print("\nby file (CPU-s, tests)")
    for name, (cpu, n) in sorted(per_file.items(), key=lambda kv: -kv[1][0])[:40]:
        print(f"{cpu:8.1f} {int(n):4d}  {name}")
    per_fixture: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for f in fixtures:
        entry = per_fixture[f"{f['fixture']} ({f['scope']}, {f['where']})"]
        entry[0] += f["cpu"]
        entry[1] += 1
    print("\nby fixture setup (CPU-s, setups)")
    for name, (cpu, n) in sorted(per_fixture.items(), key=lambda kv: -kv[1][0])[:30]:
        print(f"{cpu:8.1f} {int(n):4d}  {name}")
    print("\nby test (CPU-s, wall-s, setup CPU-s)")
    for t in sorted(tests, key=lambda t: -t["cpu"])[:top]:
        print(f"{t['cpu']:8.1f} {t['wall']:7.1f} {t.get('setup', 0):6.1f}  {t['test']}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
