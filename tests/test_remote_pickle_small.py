"""Small pickles at a URL (issue 41 item 6): a dataset opened at a URL pickles its arguments and
its manifest's digest, never its fetched tables, so its pickle does not grow with its samples;
the process that unpickles it (a DataLoader worker) fetches the manifest and tables again itself
(checked against the manifest's xxh3, as any open) and refuses a dataset written again at the URL
since. A real HTTP server with Range requests on the loopback (``bounds_servers.FileServer``)."""

from __future__ import annotations

import os
import pickle
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from bounds_servers import FileServer, file_server
from tiny_dataset import write_tiny

import packer
from packer.core.manifest import load_manifest, write_manifest
from packer.errors import FormatError

SIZES = (1_000, 1_000_000)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileServer]:
    www = tmp_path_factory.mktemp("remote_pickle")
    for n in SIZES:
        write_tiny(www / f"n{len(str(n))}.npy", n)  # equal name lengths
    with file_server(www) as running:
        yield running


def _url(served: FileServer, n: int) -> str:
    return f"{served.endpoint}/n{len(str(n))}.npy"


def _gets(served: FileServer, name: str) -> int:
    return sum(1 for s in served.seen if s.startswith(f"GET /{name}"))


def test_the_pickle_at_a_url_of_a_million_samples_is_that_of_a_thousand(
    served: FileServer,
) -> None:
    sizes = {}
    for n in SIZES:
        dataset = packer.open_dataset(_url(served, n), output="bytes")
        state = pickle.dumps(dataset)
        sizes[n] = len(state)
        index = f"n{len(str(n))}.npy/index.npy"
        before = _gets(served, index)
        clone = pickle.loads(state)
        assert _gets(served, index) == before  # opened again on first use, not at unpickling
        last = n - 1
        assert clone[last] == dataset[last] == (bytes([last % 251]), last % 10)
        assert clone.keys[last] == f"{last:07d}" and len(clone) == n
        assert _gets(served, index) == before  # mapped from the node's copy, not fetched
        assert clone.reader is not dataset.reader
        assert not clone.first.flags.owndata  # a view of the mapped file
    # the same but for the digits of the arrays' places and sizes in the node's file
    assert abs(sizes[1_000] - sizes[1_000_000]) <= 128 and sizes[1_000_000] < 4096, sizes


def test_without_the_node_copy_the_worker_fetches_the_tables_itself(
    served: FileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On another machine (the node-local file missing) the clone opens the URL again."""
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "home"))
    n = SIZES[1]
    dataset = packer.open_dataset(_url(served, n), output="bytes")
    state = pickle.dumps(dataset)
    shutil.rmtree(tmp_path / "home" / "tables")  # the spill file is gone
    index = f"n{len(str(n))}.npy/index.npy"
    before = _gets(served, index)
    clone = pickle.loads(state)
    assert clone[n - 1] == dataset[n - 1] and clone.keys[7] == "0000007"
    assert _gets(served, index) == before + 1  # fetched the table itself, checked


class Pickled(NamedTuple):
    """A 100-sample dataset served from its own folder, opened and pickled."""

    server: FileServer
    root: Path
    dataset: Any
    state: bytes
    home: Path


@pytest.fixture
def pickled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pickled]:
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "home"))
    root = write_tiny(tmp_path / "www" / "out.npy", 100)
    with file_server(root.parent) as own:
        dataset = packer.open_dataset(f"{own.endpoint}/out.npy", output="bytes")
        yield Pickled(own, root, dataset, pickle.dumps(dataset), tmp_path / "home")


def _refused_after(made: Pickled) -> Any:
    shutil.rmtree(made.home / "tables")  # no node copy: the clone opens the URL again
    return pickle.loads(made.state)


def test_a_dataset_written_again_at_the_url_after_pickling_is_refused(pickled: Pickled) -> None:
    shutil.rmtree(pickled.root)
    write_tiny(pickled.root, 101)  # consistent, and another dataset
    mapped = pickle.loads(pickled.state)  # the node's copy: what the parent opened, no request
    assert len(mapped) == 100 and mapped[99] == pickled.dataset[99]
    clone = _refused_after(pickled)
    with pytest.raises(FormatError, match="was replaced after the dataset was opened"):
        clone[0]
    with pytest.raises(FormatError, match="its packer.json is another"):
        len(clone)  # refused again, never half open


def test_a_manifest_edited_at_the_url_after_pickling_is_refused(pickled: Pickled) -> None:
    manifest = load_manifest(pickled.root)
    manifest.classes[0] = "renamed"  # the tables untouched: only the digest tells
    write_manifest(pickled.root, manifest)
    with pytest.raises(FormatError, match="its packer.json is another"):
        _refused_after(pickled)[0]


def test_a_node_copy_with_a_flipped_byte_is_not_used(pickled: Pickled) -> None:
    """The mapped file is checked against the digest the parent pickled: a damaged copy is
    never served; the clone fetches the tables again."""
    (copy,) = (pickled.home / "tables").iterdir()
    raw = bytearray(copy.read_bytes())
    raw[len(raw) // 2] ^= 1
    copy.write_bytes(raw)
    before = _gets(pickled.server, "out.npy/index.npy")
    clone = pickle.loads(pickled.state)
    assert [clone[i] for i in range(100)] == [pickled.dataset[i] for i in range(100)]
    assert _gets(pickled.server, "out.npy/index.npy") == before + 1


def _as_list(batch: list) -> list:
    return batch


def test_dataloader_workers_read_a_url_dataset_from_small_pickles(served: FileServer) -> None:
    """forkserver workers (the dataset pickled to each): every sample as the parent reads it."""
    dataset = packer.open_dataset(_url(served, SIZES[0]), output="bytes")
    index = f"n{len(str(SIZES[0]))}.npy/index.npy"
    before = _gets(served, index)
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=50,
        num_workers=2,
        multiprocessing_context="forkserver",
        collate_fn=_as_list,
    )
    got = [item for batch in loader for item in batch]
    assert got == [dataset[i] for i in range(len(dataset))]
    assert _gets(served, index) == before  # each worker mapped the node's copy


def test_node_copies_unused_for_a_week_are_removed_when_one_is_written(
    served: FileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "home"))
    tables = tmp_path / "home" / "tables"
    tables.mkdir(parents=True)
    old, recent = tables / "old.bin", tables / "recent.bin"
    old.write_bytes(b"x")
    recent.write_bytes(b"y")
    week = time.time() - 7 * 86400
    os.utime(old, (week - 60, week - 60))
    os.utime(recent, (week + 3600, week + 3600))
    pickle.dumps(packer.open_dataset(_url(served, SIZES[0]), output="bytes"))
    assert not old.exists() and recent.exists()
    assert len(list(tables.glob("*-*.bin"))) == 1  # the new copy
