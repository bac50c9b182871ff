"""One open path (issue 43 item 2): ``open_dataset`` runs ``open_packed`` once and hands its
typed ``Packed`` to the dataset class, so ``packer.json`` is opened once per open (counted by
strace on the real process: ``open``, ``openat`` and ``openat2``, which packer's contained
opens use); the overloads of ``open_dataset`` say what it returns."""

from __future__ import annotations

import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from tiny_dataset import write_tiny

import packer
from packer.demo.image import DemoTree
from packer.errors import PackerError
from packer.read.fields import FieldDataset
from packer.read.open import open_dataset
from packer.read.store import open_packed

OPEN = """
import sys
import packer
for path, split in ((sys.argv[1], None), (sys.argv[2], "val")):
    print("OPENING", path, split, flush=True)
    dataset = packer.open_dataset(path, split=split, output="bytes")
    print(len(dataset), flush=True)
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_an_open_reads_packer_json_once(tree: DemoTree, tmp_path: Path) -> None:
    plain = write_tiny(tmp_path / "plain.npy", 30)
    splits = tmp_path / "imagenet"
    shutil.copytree(tree.root, splits / "train")
    shutil.copytree(tree.root, splits / "val")
    packer.convert(splits, tmp_path / "split.lmdb", workers=1, progress=False)
    log = tmp_path / "strace.log"
    subprocess.run(
        # --seccomp-bpf: only the traced calls stop the process (half the CPU of every call)
        ["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=open,openat,openat2", "-o", str(log)]
        + [sys.executable, "-c", OPEN, str(plain), str(tmp_path / "split.lmdb")],
        check=True,
        capture_output=True,
    )
    opens = [line for line in log.read_text().splitlines() if "packer.json" in line]
    opens = [line for line in opens if "ENOENT" not in line]
    # one open of the plain output's manifest; the split output's top one and val's one
    assert len(opens) == 3, opens
    assert sum("= -1" in line for line in opens) == 0


def test_a_dataset_class_takes_the_packed_output_an_open_made(tmp_path: Path) -> None:
    root = write_tiny(tmp_path / "out.npy", 12)
    packed = open_packed(root, max_open_files=3)
    dataset = packer.NPYDataset(packed, output="bytes")
    assert dataset[11] == (bytes([11]), 1)
    assert dataset.reader is packed.reader and packed.options.max_open_files == 3
    with pytest.raises(PackerError, match="holds format 'npy', not 'lmdb'"):
        packer.LMDBDataset(open_packed(root))
    with pytest.raises(PackerError, match="readahead: the read options of an open output"):
        packer.NPYDataset(open_packed(root), readahead=True)


def test_the_overloads_say_a_fields_dataset_is_one() -> None:
    returns = {
        typing.get_type_hints(o).get("kind"): typing.get_type_hints(o)["return"]
        for o in typing.get_overloads(open_dataset)
    }
    assert returns[typing.Literal["fields"]] is FieldDataset
    assert FieldDataset in typing.get_args(returns[type(None)])
