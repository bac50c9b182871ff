"""What every benchmark script records about its run: a stderr log stamped with the seconds
since the start, the fields its JSON opens with (what, when, the command, the machine, the
options), and where the JSON is written."""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["report_head", "run_costs", "save_report", "stamped_log"]


def stamped_log(started: float) -> Callable[[str], None]:
    """A log to stderr, each line prefixed with the seconds since ``started`` (perf_counter)."""

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    return log


def report_head(
    benchmark: str, machine: dict[str, Any], args: argparse.Namespace
) -> dict[str, Any]:
    """The fields a benchmark's JSON opens with: its name, the UTC date, the command line that
    ran it, the machine and the parsed options (paths as text)."""
    return {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


def run_costs(started: float, waited: float, load_before: Any, load_after: Any) -> dict[str, Any]:
    """How long the run took, how much of it went on waiting for the machine to go quiet, and
    the load average before and after (None where the system has none)."""
    return {
        "seconds_total": time.perf_counter() - started,
        "seconds_waiting_for_quiet": waited,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }


def save_report(path: Path, report: dict[str, Any], indent: int = 1) -> Path:
    """Write ``report`` as JSON to ``path`` (its folder created), ending in a newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=indent) + "\n")
    return path
