"""Small pickles (issue 41 item 6): a dataset over a packed output pickles its arguments and
what it opened (the manifest's digest, the folder's and shards' identity), never its tables, so
its pickle does not grow with its samples; the process that unpickles it (a spawned DataLoader
worker) maps the tables itself and refuses an output that changed on disk since the open."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from tiny_dataset import write_tiny

import packer
from packer.core.manifest import load_manifest, write_manifest
from packer.demo.fields import make_caption_set
from packer.demo.image import DemoTree
from packer.demo.video import make_video_tree
from packer.errors import FormatError, PackerError
from packer.write.convert import convert_video


def test_the_pickle_of_a_million_samples_is_the_pickle_of_a_thousand(tmp_path: Path) -> None:
    sizes = {}
    for n in (1_000, 1_000_000):
        root = write_tiny(tmp_path / f"n{len(str(n))}" / "out.npy", n)  # equal path lengths
        dataset = packer.open_dataset(root, output="bytes")
        state = pickle.dumps(dataset)
        sizes[n] = len(state)
        clone = pickle.loads(state)
        assert len(clone) == n
        last = n - 1
        assert clone[last] == dataset[last] == (bytes([last % 251]), last % 10)
        assert clone.keys[last] == f"{last:07d}"
        assert clone.reader is not dataset.reader  # its own map of the tables
    # the same but for the bytes of a few integers (the shard's size in its identity)
    assert abs(sizes[1_000] - sizes[1_000_000]) <= 8 and sizes[1_000_000] < 2048


def _every_kind(tree: DemoTree, tmp_path: Path) -> dict[str, object]:
    image = tmp_path / "images.lmdb"
    packer.convert(tree.root, image, workers=1, progress=False)
    video_src = make_video_tree(tmp_path / "frames", per_class=1)
    video = tmp_path / "clips.npy"
    convert_video(video_src.root, video, workers=1, progress=False)
    make_caption_set(tmp_path / "captions", samples=6)
    fields = tmp_path / "captions.h5"
    packer.convert(tmp_path / "captions", fields, workers=1, progress=False)
    images = packer.open_dataset(image, output="bytes")
    return {
        "image": images,
        "video": packer.open_dataset(video, output="bytes", num_frames=3),
        "fields": packer.open_dataset(fields, fields=("__key__", "txt")),
        "mixture": packer.Mixture({"a": images, "b": packer.open_dataset(image)}, seed=3),
    }


def test_every_kind_and_a_mixture_read_the_same_from_a_small_pickle(
    tree: DemoTree, tmp_path: Path
) -> None:
    for kind, dataset in _every_kind(tree, tmp_path).items():
        state = pickle.dumps(dataset)
        assert len(state) < 4096, kind  # no table inside
        clone = pickle.loads(state)
        n = len(dataset)  # type: ignore[arg-type]
        assert len(clone) == n
        for i in (0, n // 2, n - 1):
            got, want = clone[i], dataset[i]  # type: ignore[index]
            if kind == "mixture":  # PIL images of the second source: compare their pixels
                got, want = pickle.dumps(got), pickle.dumps(want)
            assert got == want, (kind, i)


def test_a_table_changed_after_pickling_is_refused(tmp_path: Path) -> None:
    root = write_tiny(tmp_path / "out.npy", 100)
    state = pickle.dumps(packer.open_dataset(root, output="bytes"))
    raw = bytearray((root / "index.npy").read_bytes())
    raw[-16] ^= 1  # the last sample's label
    (root / "index.npy").write_bytes(raw)
    clone = pickle.loads(state)  # opened again on first use: the refusal is that use's
    with pytest.raises(PackerError, match="index.npy.*differs from the checksum"):
        clone[0]
    with pytest.raises(PackerError, match="index.npy.*differs from the checksum"):
        len(clone)  # refused again, never half open


def test_an_output_written_again_after_pickling_is_refused(tmp_path: Path) -> None:
    root = write_tiny(tmp_path / "out.npy", 100)
    state = pickle.dumps(packer.open_dataset(root, output="bytes"))
    shutil.rmtree(root)
    write_tiny(root, 101)  # tables and manifest consistent, another dataset
    with pytest.raises(FormatError, match="was replaced after the dataset was opened"):
        pickle.loads(state)[0]


def test_a_manifest_written_again_in_place_after_pickling_is_refused(tmp_path: Path) -> None:
    root = write_tiny(tmp_path / "out.npy", 100)
    state = pickle.dumps(packer.open_dataset(root, output="bytes"))
    manifest = load_manifest(root)
    manifest.classes[0] = "renamed"  # tables untouched, the manifest consistent
    write_manifest(root, manifest)
    with pytest.raises(FormatError, match="opened: its packer.json is another"):
        pickle.loads(state)[0]


def test_a_shard_replaced_after_pickling_is_refused(tmp_path: Path) -> None:
    root = write_tiny(tmp_path / "out.npy", 100)
    state = pickle.dumps(packer.open_dataset(root, output="bytes"))
    shard = root / "shard-00000.npy"
    data = shard.read_bytes()
    shard.unlink()
    shard.write_bytes(data[::-1])  # same size, another file
    with pytest.raises(FormatError, match="a shard was replaced"):
        pickle.loads(state)[0]


def test_what_the_caller_changed_travels_with_the_pickle(tmp_path: Path) -> None:
    root = write_tiny(tmp_path / "out.npy", 100)
    dataset = packer.open_dataset(root, output="bytes", target_transform=abs)
    dataset.targets[3] = 7  # relabelled in place
    dataset.replaced = 2
    dataset.note = "mine"
    clone = pickle.loads(pickle.dumps(dataset))
    assert clone[3] == (bytes([3]), 7)
    assert (clone.replaced, clone.note, clone.target_transform) == (2, "mine", abs)
    assert np.array_equal(clone.targets, dataset.targets)


def test_a_relative_root_reopens_from_another_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny(tmp_path / "out.npy", 20)
    monkeypatch.chdir(tmp_path)
    state = pickle.dumps(packer.open_dataset("out.npy", output="bytes"))
    os.chdir("/")
    assert pickle.loads(state)[19] == (bytes([19]), 9)
