"""The layout ARCHITECTURE.md describes holds: no import circle, small modules, and every
registered format meets the storage core's contracts (so a new format is one module + one entry)."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import packer
from packer.formats import FORMATS, by_name
from packer.formats.base import LAYOUTS, ReaderBase
from packer.formats.writer import Writer

PACKAGE = Path(packer.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """Every packer module ``path`` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module:
            # `from packer import fast_decoders` imports the module, not the package's facade
            subs = [f"{node.module}.{a.name}" for a in node.names]
            names = [s for s in subs if s in known] or [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        found.update(n for n in names if n in known)
    return found


def test_no_import_circle() -> None:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths)
    graph = {m: imports(p, known) - {m} for m, p in paths.items()}
    # a package's __init__ re-exporting its own modules is not a circle of responsibilities
    for m in graph:
        graph[m] = {d for d in graph[m] if not (m.startswith(d + ".") and d != "packer")}
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                circles.append(trail[trail.index(d) :] + [d] if d in trail else [m, d])
            elif d not in state:
                visit(d, [*trail, d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert circles == []


def test_modules_stay_small() -> None:
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    assert {m: n for m, n in sizes.items() if n > 400} == {}


@pytest.mark.parametrize("name", sorted({m.NAME for m in FORMATS.values()}))
def test_every_format_meets_the_contracts(name: str) -> None:
    module = by_name(name)
    for attribute in ("NAME", "SUFFIXES", "SHARD_SUFFIX", "LAYOUTS", "TRANSCODE"):
        assert hasattr(module, attribute), attribute
    assert set(module.LAYOUTS) <= set(LAYOUTS) and module.LAYOUTS
    assert all(FORMATS[s] is module for s in module.SUFFIXES)
    assert issubclass(module.Reader, ReaderBase)
    assert "_read_file" in {n for c in module.Reader.__mro__[:-2] for n in vars(c)}
    for method in ("write", "finish_shard", "__enter__", "__exit__"):
        assert callable(getattr(module.Writer, method))
    params = list(inspect.signature(module.Writer).parameters)
    assert params == ["root", "planned_shard_bytes", "layout", "kind"]
    protocol = {n for n in vars(Writer) if not n.startswith("_") or n in ("__enter__", "__exit__")}
    assert protocol <= set(dir(module.Writer))


def test_the_package_ships_no_benchmark_harness() -> None:
    """``benchmarks/harness`` serves the scripts and the tests only: no packer module imports it,
    and every module of ``packer/tools`` is reached from the CLI or the public API."""
    harness = Path(__file__).resolve().parents[1] / "benchmarks" / "harness"
    moved = {f"harness.{p.stem}" for p in harness.glob("*.py")} | {"harness"}
    for path in PACKAGE.rglob("*.py"):
        assert imports(path, moved) == set(), f"{path} imports the benchmarks' harness"
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths)
    reached: set[str] = set()
    todo = ["packer", "packer.cli", "packer.__main__", "packer.video"]
    while todo:
        m = todo.pop()
        if m in reached or m not in paths:
            continue
        reached.add(m)
        todo.extend(imports(paths[m], known))
    tools = {m for m in known if m.startswith("packer.tools.")}
    assert sorted(tools - reached) == []


def _floors() -> list[list[str]]:
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "floors"]
    return [[f"packer.{m.strip()}" for m in floor.split(":")] for floor in contract["layers"]]


def test_imports_follow_the_floors() -> None:
    """import-linter's layers contract in pyproject.toml is ARCHITECTURE.md's floors; it holds."""
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run(
        [str(lint), "--no-cache", "--contract", "floors"],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_module_has_a_floor() -> None:
    """A new module must be placed on a floor (import-linter ignores modules no layer names)."""
    placed = [m for floor in _floors() for m in floor]
    unplaced = [
        m
        for p in PACKAGE.rglob("*.py")
        if (m := module_name(p)) not in ("packer", "packer.video")
        and not any(m == f or m.startswith(f + ".") for f in placed)
    ]
    assert unplaced == []


def test_architecture_md_lists_the_checked_floors() -> None:
    """The floors ARCHITECTURE.md shows a reader are the contract import-linter checks."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    block = text.split("```floors\n", 1)[1].split("```", 1)[0]
    written = [[f"packer.{m.strip()}" for m in line.split(":")] for line in block.splitlines()]
    assert written == _floors()
