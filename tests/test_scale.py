"""ImageNet-sized indexes: opening a large output reads no shard and makes no Python object per
sample; keys stay lazy, compact and correct."""

from __future__ import annotations

import os
import pickle
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness.scale import index_bytes, make_linked_tree, make_packed, uss_bytes

import packer
from packer.core.keytable import KeyTable
from packer.core.manifest import KEYS_NAME, write_keys
from packer.errors import FormatError
from packer.source.images import scan

SAMPLES = 200_000
ODD_KEYS = {5: "c0000/two\nlines", 7: "c0000/caf\udce9", 9: "c0000/back\\slash\r"}

_opened: list[str] | None = None  # paths opened while recording (an audit hook cannot go)


def _audit(event: str, args: tuple) -> None:
    if _opened is not None and event in ("open", "os.open", "mmap.__new__"):
        _opened.append(str(args[0]) if args else "")


sys.addaudithook(_audit)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scale") / "big.lmdb"
    return make_packed(root, SAMPLES, classes=100, shards=4, keys=ODD_KEYS)


def _shard_handles(root: Path) -> list[str]:
    """Descriptors and mappings of this process that name one of the output's shards."""
    shards = {str(p) for p in root.glob("shard-*")}
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        found += [target] if target in shards else []
    with open("/proc/self/maps") as fh:
        found += [line for line in fh if any(s in line for s in shards)]
    return found


def _recording() -> Iterator[list[str]]:
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def _counting_calls() -> Iterator[int]:
    """Counts the function calls (Python and C) this thread makes from the first ``next`` to
    the second, which returns the count."""
    made = [0]

    def count(frame: object, event: str, arg: object) -> None:  # noqa: ARG001
        if event in ("call", "c_call"):
            made[0] += 1

    sys.setprofile(count)
    try:
        yield 0
    finally:
        sys.setprofile(None)
    yield made[0]


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_open_reads_no_shard_and_makes_no_object_per_sample(big: Path) -> None:
    packer.open_dataset(big)  # imports and first-time caches out of the measurement
    recording = _recording()
    opened = next(recording)
    tracemalloc.start()
    calls = _counting_calls()
    next(calls)
    dataset = packer.open_dataset(big, output="bytes")
    made = next(calls)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    recording.close()
    # the work of the open as a count, not a time: ~6 000 Python and C calls; any call per
    # sample would make 200 000 more (a time bound instead failed on a loaded machine)
    assert len(dataset) == SAMPLES and made < SAMPLES // 10, made
    # A key, a tuple or an int per sample would cost 28 to 100 bytes each; numpy tables are
    # memory-mapped (not traced), only the int64 targets are a copy.
    assert peak / SAMPLES < 20, f"{peak / SAMPLES:.1f} bytes per sample allocated"
    assert not [p for p in opened if "shard-" in p], opened
    assert not _shard_handles(big)
    assert index_bytes(big) / SAMPLES < 64
    assert dataset[SAMPLES - 1][1] == 99 and dataset[0][0][:2] == b"\xff\xd8"
    assert _shard_handles(big)  # reading opened them, so the check above can see one


def test_keys_are_lazy_compact_and_exact(big: Path) -> None:
    dataset = packer.open_dataset(big)
    keys = dataset.keys
    assert isinstance(keys, KeyTable) and keys._starts is None  # mapped and checked, not parsed
    tracemalloc.start()
    assert len(keys) == SAMPLES
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak / SAMPLES < 10  # the line starts, 4 bytes per key
    for i, key in ODD_KEYS.items():
        assert keys[i] == key
    assert keys[0] == "c0000/img_0000000" and keys[-1] == f"c0099/img_{SAMPLES - 1:07d}"
    assert keys[4:6] == ["c0000/img_0000004", ODD_KEYS[5]] and keys[-1:] == [keys[SAMPLES - 1]]
    assert f"{SAMPLES} strings" in repr(keys) and repr(keys[0]) in repr(keys)
    with pytest.raises(IndexError):
        keys[SAMPLES]
    assert sum(1 for _ in keys) == SAMPLES
    assert repr(ODD_KEYS[5]) in dataset._describe(5)
    again = pickle.loads(pickle.dumps(dataset))
    assert again.keys[7] == ODD_KEYS[7] and again.keys._starts is not None
    assert len(pickle.dumps(keys)) < 1000  # the path, never the keys


def test_key_table_refuses_what_does_not_match(tmp_path: Path) -> None:
    write_keys(tmp_path, ["a/b", "c/d"])
    with pytest.raises(FormatError, match="holds 2 keys but the manifest says 3"):
        len(KeyTable(tmp_path / KEYS_NAME, 3))
    for bad, n in (["a/b", "/etc/x"], 1), (["a/b", "c/../d"], 1), (["a//b"], 0), (["", "a"], 0):
        write_keys(tmp_path, bad)
        with pytest.raises(FormatError, match=f"key {n} .* not a plain relative name"):
            KeyTable(tmp_path / KEYS_NAME, plain=True)[0]
    for bad in (["a/b/"], ["a/."], ["a/b", "c\0d"], ["x", ".."]):
        write_keys(tmp_path, bad)
        with pytest.raises(FormatError, match="not a plain relative name"):
            len(KeyTable(tmp_path / KEYS_NAME, plain=True))
    write_keys(tmp_path, ["a/.b", "..c/d", "e\n/f", "g\\/h"])
    assert list(KeyTable(tmp_path / KEYS_NAME, 4, plain=True)) == [
        "a/.b",
        "..c/d",
        "e\n/f",
        "g\\/h",
    ]
    write_keys(tmp_path, [])
    assert list(KeyTable(tmp_path / KEYS_NAME, 0, plain=True)) == []


def test_linked_tree_and_uss(tmp_path: Path) -> None:
    assert make_linked_tree(tmp_path / "tree", classes=3, per_class=5) == 15
    assert make_linked_tree(tmp_path / "tree", classes=3, per_class=5) == 15  # kept
    scanned = scan(tmp_path / "tree")
    assert len(scanned.samples) == 15 and scanned.classes == ["c0000", "c0001", "c0002"]
    assert len({s.path for s in scanned.samples}) == 15
    uss = uss_bytes()
    assert uss is None or uss > 0
    result = packer.convert(tmp_path / "tree", tmp_path / "o.lmdb", check="fast", progress=False)
    assert (16 + 24 + 18) * 15 < index_bytes(result.dst) < (16 + 24 + 18) * 15 + 512  # + headers
