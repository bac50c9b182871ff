"""A fuzz corpus of damaged and crafted packer outputs: only packer errors leave packer.

Small real outputs of every format (images) and one video output are copied and damaged:
crafted manifest edits (every field set to null, a wrong type, a negative or huge number, or
removed; ``classes: 5``, ``options: null``, ...), crafted tables and keys (negative labels,
records moved to another shard, offsets near 2**63, keys leaving the folder, ...) and random
mutations with a fixed seed (bit flips, flips in the ``.npy`` headers, truncations, a table field
or a manifest value set to an out-of-range one, a file removed) of ``packer.json``,
``index.npy``, ``records.npy`` and ``keys.txt``. Nothing binary is committed: the corpus is
generated from the seed. For every damaged copy:

- ``packer.open_dataset`` and reading every sample and key either give the original data or
  raise a ``PackerError`` — never another exception, never a hang; data that differs
  silently must at least make ``verify`` report a problem (it compares the tables with the
  manifest's checksums); and when ``verify`` finds nothing, the data must be the original's;
- ``packer verify`` and ``packer inspect`` exit 0 or 1, with no traceback and, on a refusal,
  one line of error.

``PACKER_FUZZ_CASES=2000`` raises the number of random mutations (default 150) for a longer run.
"""

from __future__ import annotations

import copy
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import packer
from packer.cli.app import main
from packer.core.manifest import INDEX_NAME, KEYS_NAME, MANIFEST_NAME, RECORDS_NAME
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.errors import PackerError
from packer.read.verify import verify

pytestmark = pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
SEED = 18
RANDOM_CASES = int(os.environ.get("PACKER_FUZZ_CASES", "150"))
TIMEOUT = 30  # seconds for one damaged copy: far more than any refusal or read takes
FILES = (MANIFEST_NAME, INDEX_NAME, RECORDS_NAME, KEYS_NAME)
DATASETS = ("images.lmdb", "images.h5", "images.npy", "images.bmp", "video.h5")
BAD_VALUES: dict[str, Any] = {
    "null": None,
    "string": "x",
    "negative": -1,
    "huge": 2**64,
    "float": 1.5,
    "list": [],
    "object": {},
    "bool": True,
}
REMOVED = object()
# Fields a manifest may hold that these outputs do not: set them to bad values as well.
ABSENT = ("options.pixels", "options.resize", "options.splits", "options.fps", "options.part")


@dataclass(frozen=True)
class Original:
    """A sound output and what reading it gives."""

    root: Path
    kwargs: dict[str, Any]
    items: list[Any]
    keys: list[str]


def read_all(root: Path, kwargs: dict[str, Any]) -> tuple[list[Any], list[str]]:
    """Every sample (stored bytes and label) and every key, through the public API."""
    ds = packer.open_dataset(root, output="bytes", **kwargs)
    return [ds[i] for i in range(len(ds))], list(ds.keys)


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Original]:
    base = tmp_path_factory.mktemp("fuzz")
    images = make_image_tree(base / "images", classes=3, per_class=3, size=(64, 48), bad=1)
    videos = make_video_tree(base / "videos", classes=2, per_class=2, frames=(3, 5))
    out = {}
    for name in DATASETS:
        src, kwargs = (
            (videos.root, {"num_frames": 6})
            if name.startswith("video")
            else (
                images.root,
                {},
            )
        )
        root = base / name
        packer.convert(src, root, shard_size="10kB", workers=1, progress=False)
        out[name] = Original(root, kwargs, *read_all(root, kwargs))
    return out


@contextmanager
def deadline(seconds: int, what: str) -> Iterator[None]:
    """Fail with ``what`` instead of hanging (SIGALRM interrupts a blocked call)."""

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what}: still running after {seconds} s (a hang)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def damaged_copy(original: Path, dst: Path, name: str, data: bytes | None) -> Path:
    """A copy of ``original`` (data files hard-linked, never written) whose file ``name`` holds
    ``data`` (None: the file is removed)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(original, dst, copy_function=os.link)
    (dst / name).unlink()
    if data is not None:
        (dst / name).write_bytes(data)
    return dst


def check_reads(case: str, original: Original, root: Path) -> bool:
    """Reading gives the original data or a PackerError; return whether it read the original."""
    try:
        with deadline(TIMEOUT, case):
            items, keys = read_all(root, original.kwargs)
    except PackerError:
        return False
    except Exception as exc:  # the finding this file exists for: name the case
        pytest.fail(f"{case}: open_dataset/read raised {type(exc).__name__}: {exc}")
    if items == original.items and keys == original.keys:
        return True
    try:
        found = not verify(root, progress=False).ok
    except PackerError:
        found = True
    assert found, f"{case}: read different data, and verify reports nothing"
    return False


def check_cli(case: str, runner: CliRunner, args: list[str]) -> int:
    """The command exits 0 or 1, never with a traceback; a refusal is one line."""
    with deadline(TIMEOUT, case):
        result = runner.invoke(main, args)
    where = f"{case}: packer {' '.join(args[:-1])} exited {result.exit_code}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail(f"{where} with {type(result.exception).__name__}: {result.exception}")
    assert result.exit_code in (0, 1), f"{where}:\n{result.output}"
    assert "Traceback" not in result.output and "internal error" not in result.output, where
    if result.stderr:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), f"{where}:\n{result.stderr}"
    return int(result.exit_code)


def check_case(case: str, original: Original, root: Path, runner: CliRunner) -> str:
    """Every assertion of the module docstring for one damaged copy; returns its outcome."""
    sound = check_reads(case, original, root)
    verified = check_cli(case, runner, ["verify", "-q", str(root)])
    check_cli(case, runner, ["inspect", str(root)])
    if verified == 0:
        assert sound, f"{case}: verify finds nothing, yet reading does not give the original data"
    return "read as the original" if sound else "refused"


# ----------------------------------------------------------------------------- crafted manifests


def fresh(value: Any) -> Any:
    """A copy of a bad value (REMOVED itself, which is compared by identity)."""
    return value if value is REMOVED else copy.deepcopy(value)


def set_field(data: dict[str, Any], path: str, value: Any) -> None:
    """Set (or with REMOVED delete) the field at a dotted ``path`` (``shards.0.bytes``)."""
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    key: Any = int(last) if isinstance(node, list) else last
    if value is REMOVED:
        del node[key]
    else:
        node[key] = value


def field_paths(data: dict[str, Any]) -> list[str]:
    """Every field of a manifest down to the first shard, class and skipped input."""
    paths = list(data)
    for name in ("shards", "classes", "skipped"):
        if data[name]:
            paths.append(f"{name}.0")
            item = data[name][0]
            paths += [f"{name}.0.{k}" for k in item] if isinstance(item, dict) else []
    for name in ("source", "options", "files", "options.storage"):
        node = data
        for part in name.split("."):
            node = node[part]
        paths += [f"{name}.{k}" for k in node]
    return paths + [p for p in ABSENT if p not in paths]


SPECIAL: dict[str, Callable[[dict[str, Any]], Any]] = {
    "classes: 5": lambda d: d.update(classes=5),
    "options: null": lambda d: d.update(options=None),
    "num_samples as a string": lambda d: d.update(num_samples=str(d["num_samples"])),
    "one class fewer": lambda d: d.update(classes=d["classes"][:-1]),
    "repeated class": lambda d: d.update(classes=[d["classes"][0]] * len(d["classes"])),
    "another format": lambda d: d.update(format="npy" if d["format"] != "npy" else "lmdb"),
    "kind splits": lambda d: d.update(kind="splits"),
    "other layout": lambda d: d["options"].update(
        layout="shards" if d["options"]["layout"] != "shards" else "per-sample"
    ),
    "fewer samples": lambda d: d.update(num_samples=d["num_samples"] - 1),
    "a wrong table checksum": lambda d: d["files"].update({INDEX_NAME: "0" * 16}),
    "a checksum in capitals": lambda d: d["files"].update({INDEX_NAME: "ABCDEF0123456789"}),
    "pixels of a string": lambda d: d["options"].update(pixels="64"),
    "resize without quality": lambda d: d["options"].update(
        resize={"max_side": 10, "short_side": None, "reencode": False}
    ),
    "storage as a list": lambda d: d["options"].update(storage=[1, 2]),
    "NaN frames": lambda d: d["options"]["storage"].update(padding_overhead=float("nan")),
    "an unknown field": lambda d: d.update(comment="hello"),
    "an unknown shard field": lambda d: [s.update(extra=1) for s in d["shards"]],
}
RAW_MANIFESTS = {
    "empty": b"",
    "not an object": b"[1, 2]",
    "a number": b"5",
    "null": b"null",
    "an empty object": b"{}",
    "deep nesting": b"[" * 100_000 + b"]" * 100_000,
    "a 5000-digit number": b'{"layout_version": ' + b"9" * 5000 + b"}",
    "not UTF-8": b'{"format": "\xff"}',
}


def crafted_cases(originals: dict[str, Original]) -> Iterator[tuple[str, str, bytes]]:
    """(case, dataset, manifest bytes): each field of each dataset's manifest set to every bad
    value and removed, the special edits, and manifests that are no manifest at all."""
    for name, original in originals.items():
        data = json.loads((original.root / MANIFEST_NAME).read_bytes())
        edits: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
            (f"{path} = {label}", lambda d, p=path, v=value: set_field(d, p, fresh(v)))
            for path in field_paths(data)
            for label, value in [*BAD_VALUES.items(), ("removed", REMOVED)]
        ]
        for case, edit in [*edits, *SPECIAL.items()]:
            changed = copy.deepcopy(data)
            try:
                edit(changed)
            except (KeyError, IndexError):  # removing a field this manifest does not have
                continue
            yield f"{name}: {case}", name, json.dumps(changed).encode()
        for case, raw in RAW_MANIFESTS.items():
            yield f"{name}: manifest {case}", name, raw


def test_crafted_manifests(originals: dict[str, Original], tmp_path: Path) -> None:
    runner = CliRunner()
    outcomes: dict[str, int] = {}
    for case, name, raw in crafted_cases(originals):
        root = damaged_copy(originals[name].root, tmp_path / name, MANIFEST_NAME, raw)
        outcome = check_case(case, originals[name], root, runner)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("refused", 0) > 1000, outcomes  # the corpus really damages things


# ------------------------------------------------------------------------------ random mutations


def mutate(rng: np.random.Generator, data: bytes, name: str) -> tuple[str, bytes | None]:
    """One random mutation of a file's bytes (tables: most aimed at the 128-byte npy header)."""
    op = rng.choice(["flip", "header flip", "header byte", "truncate", "remove", "value"])
    if op == "value" and name in (INDEX_NAME, RECORDS_NAME):
        return table_value(rng, data)
    if op == "value" and name == KEYS_NAME:
        op = "header flip"
    if op == "remove":
        return op, None
    if op == "truncate":
        at = int(rng.integers(0, max(1, len(data))))
        return f"truncated to {at} bytes", data[:at]
    if op == "value":
        manifest = json.loads(data)
        path = str(rng.choice(field_paths(manifest)))
        label = str(rng.choice([*BAD_VALUES, "removed"]))
        value = REMOVED if label == "removed" else fresh(BAD_VALUES[label])
        try:
            set_field(manifest, path, value)
        except (KeyError, IndexError):
            pass
        return f"{path} = {label}", json.dumps(manifest).encode()
    buf = bytearray(data)
    span = min(len(buf), 128) if op.startswith("header") else len(buf)
    if not span:
        return "empty file kept", bytes(buf)
    at = int(rng.integers(0, span))
    if op == "header byte":
        buf[at] = int(rng.integers(32, 127))
        return f"byte {at} set to {chr(buf[at])!r}", bytes(buf)
    flips = [(at, int(rng.integers(0, 8)))] + [
        (int(rng.integers(0, span)), int(rng.integers(0, 8)))
        for _ in range(int(rng.integers(0, 3)))
    ]
    for pos, bit in flips:
        buf[pos] ^= 1 << bit
    return f"bits flipped at {flips}", bytes(buf)


def table_value(rng: np.random.Generator, data: bytes) -> tuple[str, bytes]:
    """The table with one field of one row set to a value that is often out of range."""
    table = np.load(io.BytesIO(data)).copy()
    row, column = int(rng.integers(0, len(table))), str(rng.choice(table.dtype.names))
    info = np.iinfo(table.dtype[column])
    value = int(rng.choice([-1, 0, 1, 2, info.max, info.min, int(rng.integers(-99, 99))]))
    value = min(max(value, info.min), info.max)
    table[column][row] = value
    out = io.BytesIO()
    np.save(out, table)
    return f"row {row} {column} set to {value}", out.getvalue()


def test_random_mutations(originals: dict[str, Original], tmp_path: Path) -> None:
    rng = np.random.default_rng(SEED)
    runner = CliRunner()
    outcomes: dict[str, int] = {}
    for n in range(RANDOM_CASES):
        name = str(rng.choice(DATASETS))
        file = str(rng.choice(FILES))
        original = originals[name]
        what, data = mutate(rng, (original.root / file).read_bytes(), file)
        case = f"random case {n} (seed {SEED}): {name}/{file} {what}"
        root = damaged_copy(original.root, tmp_path / name, file, data)
        outcome = check_case(case, original, root, runner)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("refused", 0) > RANDOM_CASES // 3, outcomes


# -------------------------------------------------------------------------------- crafted tables


def edit_table(name: str, edit: Callable[[np.ndarray], Any]) -> Callable[[Path], bytes]:
    """A table edit: ``edit`` changes a copy of the table in place (or returns a new array)."""

    def make(root: Path) -> bytes:
        table = np.load(root / name).copy()
        changed = edit(table)
        table = table if changed is None else changed
        out = io.BytesIO()
        np.save(out, table, allow_pickle=True)
        return out.getvalue()

    return make


def swap_files(records: np.ndarray) -> None:
    """Swap the file of the first record with the last one's (shards: two different shards)."""
    records["file"][[0, -1]] = records["file"][[-1, 0]]


def set_row(column: str, value: int, row: int = 0) -> Callable[[np.ndarray], None]:
    def edit(table: np.ndarray) -> None:
        table[column][row] = value

    return edit


def header_brace_flipped(root: Path, name: str = INDEX_NAME) -> bytes:
    """``name`` with one bit flipped in its npy header's closing brace: numpy's header parser
    then raises tokenize.TokenError (neither OSError nor ValueError)."""
    data = bytearray((root / name).read_bytes())
    data[data.index(b"}")] ^= 0x01  # "}" -> "|"
    return bytes(data)


TABLE_EDITS: dict[str, tuple[str, Callable[[Path], bytes | None]]] = {
    "a negative label": (INDEX_NAME, edit_table(INDEX_NAME, set_row("label", -1))),
    "a label past the classes": (INDEX_NAME, edit_table(INDEX_NAME, set_row("label", 3))),
    "a huge label": (INDEX_NAME, edit_table(INDEX_NAME, set_row("label", 2**31 - 1))),
    "a count of 0": (INDEX_NAME, edit_table(INDEX_NAME, set_row("count", 0))),
    "a negative count": (INDEX_NAME, edit_table(INDEX_NAME, set_row("count", -1))),
    "a first record shifted": (INDEX_NAME, edit_table(INDEX_NAME, set_row("first", 1, 1))),
    "one sample fewer": (INDEX_NAME, edit_table(INDEX_NAME, lambda t: t[:-1])),
    "an index of int64": (INDEX_NAME, edit_table(INDEX_NAME, lambda t: t["label"].astype("<i8"))),
    "a 2-D index": (INDEX_NAME, edit_table(INDEX_NAME, lambda t: np.stack([t, t]))),
    "an index of objects": (INDEX_NAME, edit_table(INDEX_NAME, lambda t: t.astype(object))),
    "an index header with a bit flipped": (INDEX_NAME, header_brace_flipped),
    "a records header with a bit flipped": (
        RECORDS_NAME,
        lambda root: header_brace_flipped(root, RECORDS_NAME),
    ),
    "files of two records swapped": (RECORDS_NAME, edit_table(RECORDS_NAME, swap_files)),
    "a negative file": (RECORDS_NAME, edit_table(RECORDS_NAME, set_row("file", -1))),
    "a huge file": (RECORDS_NAME, edit_table(RECORDS_NAME, set_row("file", 2**31 - 1))),
    "a negative offset": (RECORDS_NAME, edit_table(RECORDS_NAME, set_row("offset", -1))),
    "an offset near 2**63": (RECORDS_NAME, edit_table(RECORDS_NAME, set_row("offset", 2**63 - 10))),
    "a length of 0": (RECORDS_NAME, edit_table(RECORDS_NAME, set_row("length", 0))),
    "a huge length": (RECORDS_NAME, edit_table(RECORDS_NAME, set_row("length", 2**32 - 1))),
    "a wrong record checksum": (RECORDS_NAME, edit_table(RECORDS_NAME, set_row("checksum", 1))),
    "one record fewer": (RECORDS_NAME, edit_table(RECORDS_NAME, lambda t: t[:-1])),
    "no index.npy": (INDEX_NAME, lambda root: None),
    "no records.npy": (RECORDS_NAME, lambda root: None),
    "no keys.txt": (KEYS_NAME, lambda root: None),
    "an empty keys.txt": (KEYS_NAME, lambda root: b""),
    "a key fewer": (KEYS_NAME, lambda root: (root / KEYS_NAME).read_bytes().split(b"\n", 1)[1]),
    "a key leaving the folder": (KEYS_NAME, lambda root: b"../x\n" + keys_tail(root)),
    "an absolute key": (KEYS_NAME, lambda root: b"/etc/passwd\n" + keys_tail(root)),
    "a key with a NUL": (KEYS_NAME, lambda root: b"a\0b\n" + keys_tail(root)),
    "a key not UTF-8": (KEYS_NAME, lambda root: b"caf\xe9\n" + keys_tail(root)),
}


def keys_tail(root: Path) -> bytes:
    """``keys.txt`` without its first line."""
    return (root / KEYS_NAME).read_bytes().split(b"\n", 1)[1]


def test_crafted_tables(originals: dict[str, Original], tmp_path: Path) -> None:
    runner = CliRunner()
    outcomes: dict[str, int] = {}
    for name, original in originals.items():
        for what, (file, make) in TABLE_EDITS.items():
            case = f"{name}: {what}"
            root = damaged_copy(original.root, tmp_path / name, file, make(original.root))
            outcome = check_case(case, original, root, runner)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("refused", 0) > 100, outcomes


# -------------------------------------------------- the escapes issue 18 found, in a real process


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "packer", *args], capture_output=True, text=True, timeout=120
    )


def refusal(done: subprocess.CompletedProcess[str]) -> str:
    """The one line a refused command prints, checked: exit 1, no traceback."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    return lines[0]


ESCAPES: dict[str, tuple[str, str, Callable[[Path], bytes | None], str]] = {
    # dataset, file, damage, what the one line says
    "classes: 5": (
        "images.npy",
        MANIFEST_NAME,
        lambda root: manifest_with(root, classes=5),
        "classes is 5; expected a list",
    ),
    "options: null": (
        "video.h5",
        MANIFEST_NAME,
        lambda root: manifest_with(root, options=None),
        "options is None; expected an object",
    ),
    "a string where a number belongs": (
        "images.lmdb",
        MANIFEST_NAME,
        lambda root: manifest_with(root, num_samples="9"),
        "num_samples is '9'; expected an integer",
    ),
    "one bit of the index header": (
        "images.h5",
        INDEX_NAME,
        header_brace_flipped,
        "cannot read index",
    ),
    "a negative label": (
        "images.bmp",
        INDEX_NAME,
        edit_table(INDEX_NAME, set_row("label", -1)),
        "a label outside the 3 classes",
    ),
    "no keys.txt": ("images.lmdb", KEYS_NAME, lambda root: None, "keys.txt"),
}


def manifest_with(root: Path, **fields: Any) -> bytes:
    data = json.loads((root / MANIFEST_NAME).read_bytes())
    data.update(fields)
    return json.dumps(data).encode()


@pytest.mark.parametrize("what", list(ESCAPES))
def test_issue_18_escapes_are_one_line_refusals(
    originals: dict[str, Original], tmp_path: Path, what: str
) -> None:
    name, file, damage, said = ESCAPES[what]
    root = damaged_copy(originals[name].root, tmp_path / name, file, damage(originals[name].root))
    # A damaged table may also be refused for its checksum (tables checked at open): then the
    # message names the table instead.
    expected = re.escape(said) if file == MANIFEST_NAME else f"{re.escape(said)}|{file}"
    for command in ("inspect", "verify"):
        done = run_cli(command, str(root))
        if command == "verify" and done.returncode == 1 and not done.stderr:
            assert file in done.stdout, done.stdout  # a finding about the damaged file
        else:
            assert re.search(expected, refusal(done))
    if file != KEYS_NAME:  # a shards layout reads without its keys
        with pytest.raises(PackerError, match=expected):
            read_all(root, originals[name].kwargs)
