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
    """``benchmarks/harness`` serves the scripts and the tests only: no packer module imports it."""
    harness = Path(__file__).resolve().parents[1] / "benchmarks" / "harness"
    moved = {f"harness.{p.stem}" for p in harness.glob("*.py")} | {"harness"}
    for path in PACKAGE.rglob("*.py"):
        assert imports(path, moved) == set(), f"{path} imports the benchmarks' harness"


def test_every_module_is_reached() -> None:
    """No orphan: every module of the package is imported, at its top or inside a function, from
    the CLI or the public API (the facade, its public modules and their lazy names)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    known = set(paths)
    reached: set[str] = set()
    facades = ("__init__.py", "video/__init__.py", "audio/__init__.py")
    lazy = {m for p in facades for m in _lazy_targets(PACKAGE / p)}
    todo = [
        "packer",
        "packer.cli",
        "packer.cli.app",
        "packer.__main__",
        "packer.video",
        "packer.audio",
        "packer.datasets",
        "packer.transforms",
        *lazy,
    ]
    while todo:
        m = todo.pop()
        if m in reached or m not in paths:
            continue
        reached.add(m)
        todo.extend(imports(paths[m], known))
        # a module's package __init__ runs first
        todo.extend(m.rsplit(".", k)[0] for k in range(1, m.count(".")))
    assert sorted(known - reached) == []


def _lazy_targets(path: Path) -> set[str]:
    """The modules a facade's ``_EXPORTS`` names load on first use."""
    tree = ast.parse(path.read_text())
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and n.value.startswith("packer.")
    }


def _contracts() -> dict[str, tuple[str, list[list[str]]]]:
    """Each floors contract of pyproject.toml: its container and its floors, top to bottom."""
    import re

    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    return {
        c["id"]: (
            c["containers"][0],
            [[m.strip() for m in re.split(r"[:|]", floor)] for floor in c["layers"]],
        )
        for c in config["tool"]["importlinter"]["contracts"]
        if c["id"].startswith("floors")
    }


def test_imports_follow_the_floors() -> None:
    """import-linter's contracts in pyproject.toml are ARCHITECTURE.md's floors; they hold."""
    lint = Path(sys.executable).parent / "lint-imports"
    run = subprocess.run(
        [str(lint), "--no-cache"], cwd=PACKAGE.parent, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout and f"{len(_contracts())} kept" in run.stdout, run.stdout


def test_every_module_has_a_floor() -> None:
    """Every module sits on a floor of its package's contract (import-linter ignores modules no
    layer names), and the package root holds only the facade and its foundations."""
    contracts = _contracts()
    placed = {
        f"{container}.{m}" for container, floors in contracts.values() for f in floors for m in f
    }
    containers = {container for container, _ in contracts.values()}
    unplaced = [
        m
        for p in PACKAGE.rglob("*.py")
        if (m := module_name(p)) not in containers | {"packer.video"}
        and not any(m == f or m.startswith(f + ".") and f not in containers for f in placed)
    ]
    assert unplaced == []
    root = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert root == ["__init__", "__main__", "_version", "datasets", "errors", "transforms"]


def test_architecture_md_lists_the_checked_floors() -> None:
    """The floors ARCHITECTURE.md shows a reader are the contracts import-linter checks."""
    import re

    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    written = {
        container: [[m.strip() for m in re.split(r"[:|]", line)] for line in block.splitlines()]
        for container, block in re.findall(r"```floors (\S+)\n(.*?)```", text, re.S)
    }
    assert written == dict(_contracts().values())


def test_architecture_md_names_every_harness_module() -> None:
    """ARCHITECTURE.md's list of the benchmarks' harness modules is complete."""
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    section = text.split("**Benchmarks' harness**", 1)[1].split("\n\n", 1)[0]
    harness = Path(__file__).resolve().parents[1] / "benchmarks" / "harness"
    names = {p.stem for p in harness.glob("*.py")} - {"__init__"}
    assert sorted(n for n in names if f"`{n}`" not in section) == []
