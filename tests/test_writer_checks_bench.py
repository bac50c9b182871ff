"""benchmarks/write_checks.py run tiny: every damage class is counted, ``scan`` misses nothing a
reader fails on, and ``fast`` misses some header and scan damage (what the Writer's default is
chosen by, docs/writing.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import write_checks

pytestmark = pytest.mark.bench


def test_write_checks_counts_what_each_level_misses(tmp_path: Path) -> None:
    assert write_checks.main(["--photos", "2", "--repeats", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "write_checks.json").read_text())
    damage = report["damage"]
    assert set(damage) == {"truncated", "nonimage", "header", "scan"}
    assert all(row["scan_misses"] == 0 and row["decode_misses"] == 0 for row in damage.values())
    assert damage["truncated"]["fast_misses"] == damage["nonimage"]["fast_misses"] == 0
    assert damage["header"]["fast_misses"] + damage["scan"]["fast_misses"] > 0
    cost = report["cpu_ms_per_photo"]
    assert 0 < cost["fast"] < cost["scan"]
