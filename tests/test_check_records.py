"""check_records=True (issue 43 item 3): a local dataset's records checked against their xxh3 in
the record table by the one record-check layer (``packer.formats.record_check``). A flipped
byte in a local shard is served by default and refused with the option (a FormatError naming
the sample, its file and ``packer verify``), through the public API, in a batch read into one
buffer and in a DataLoader worker; an intact dataset reads the same with and without."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader

import packer
from packer.demo.fields import make_caption_set
from packer.demo.image import make_image_tree
from packer.demo.video import make_video_tree
from packer.write.convert import convert_video

FLIPPED = 5  # the sample whose record gets a flipped byte


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """2 classes × 4 images in every format, and a video LMDB output; never written to."""
    root = tmp_path_factory.mktemp("check_records")
    tree = make_image_tree(root / "images", classes=2, per_class=4, size=(64, 48), bad=0)
    out = {"folder": tree.root}
    for suffix in (".lmdb", ".npy", ".h5", ".bmp"):
        out[suffix] = root / f"images{suffix}"
        packer.convert(tree.root, out[suffix], shard_size="20kB", workers=1, progress=False)
    clips = make_video_tree(root / "videos", classes=2, per_class=2, frames=(4, 5))
    out["video"] = convert_video(clips.root, root / "clips.lmdb", progress=False).dst
    return out


def flipped(
    source: Path, at: Path, sample: int = FLIPPED, nth: int = 0, bits: int = 0xFF
) -> tuple[Path, str]:
    """A copy of ``source`` at ``at`` with ``bits`` of one byte flipped in the middle of
    ``sample``'s ``nth`` record (in its shard); the file's name."""
    shutil.copytree(source, at)
    manifest = json.loads((at / "packer.json").read_text())
    index = np.load(at / "index.npy")
    records = np.load(at / "records.npy")
    row = records[int(index["first"][sample]) + nth]
    name = manifest["shards"][int(row["file"])]["name"]
    path = at / name
    data = bytearray(path.read_bytes())
    data[int(row["offset"]) + int(row["length"]) // 2] ^= bits
    path.write_bytes(bytes(data))
    return at, name


def as_list(batch: list[object]) -> list[object]:
    return batch


def stored(dataset: object) -> list[bytes]:
    return [bytes(dataset[i][0]) for i in range(len(dataset))]  # type: ignore[arg-type,index]


@pytest.mark.parametrize("suffix", [".lmdb", ".npy", ".h5", ".bmp"])
def test_an_intact_dataset_reads_the_same_with_the_check(
    outputs: dict[str, Path], suffix: str
) -> None:
    plain = packer.open_dataset(outputs[suffix], output="bytes")
    checked = packer.open_dataset(outputs[suffix], output="bytes", check_records=True)
    assert stored(checked) == stored(plain)
    everything = list(range(len(plain)))
    assert [d for d, _ in checked.__getitems__(everything)] == [
        d for d, _ in plain.__getitems__(everything)
    ]


@pytest.mark.parametrize("suffix", [".lmdb", ".npy"])
def test_a_flipped_byte_is_served_by_default_and_refused_with_the_check(
    outputs: dict[str, Path], suffix: str, tmp_path: Path
) -> None:
    intact = stored(packer.open_dataset(outputs[suffix], output="bytes"))
    root, shard = flipped(outputs[suffix], tmp_path / f"damaged{suffix}")
    served = packer.open_dataset(root, output="bytes")
    assert served[FLIPPED][0] != intact[FLIPPED]  # the default serves the damaged bytes
    checked = packer.open_dataset(root, output="bytes", check_records=True)
    assert checked[FLIPPED - 1][0] == intact[FLIPPED - 1]  # the others are served
    key = checked.keys[FLIPPED]
    named = rf"sample {FLIPPED} \('{key}'\) of .*{shard}.* differs .*packer verify"
    with pytest.raises(packer.FormatError, match=named):
        checked[FLIPPED]
    with pytest.raises(packer.FormatError, match=named):
        checked.__getitems__([0, FLIPPED, 1])
    cls = packer.LMDBDataset if suffix == ".lmdb" else packer.NPYDataset
    with pytest.raises(packer.FormatError, match=named):
        cls(root, output="bytes", check_records=True)[FLIPPED]


@pytest.mark.parametrize("suffix", [".lmdb", ".npy"])
def test_a_batch_read_into_one_buffer_is_checked(
    outputs: dict[str, Path], suffix: str, tmp_path: Path
) -> None:
    root, _ = flipped(outputs[suffix], tmp_path / f"damaged{suffix}")
    options = {"output": "bytes", "batch_buffer": True}
    served = packer.open_dataset(root, **options)
    assert len(served.__getitems__([0, FLIPPED])) == 2  # type: ignore[arg-type]
    checked = packer.open_dataset(root, check_records=True, **options)
    with pytest.raises(packer.FormatError, match=f"sample {FLIPPED} "):
        checked.__getitems__([0, FLIPPED])  # type: ignore[arg-type]


def test_a_video_frame_is_checked(outputs: dict[str, Path], tmp_path: Path) -> None:
    plain = packer.open_dataset(outputs["video"], output="numpy", num_frames=4)
    checked = packer.open_dataset(
        outputs["video"], output="numpy", num_frames=4, check_records=True
    )
    for i in range(len(plain)):
        assert np.array_equal(plain[i][0], checked[i][0])
    root, _ = flipped(outputs["video"], tmp_path / "damaged.lmdb", sample=1)
    damaged = packer.open_dataset(root, output="numpy", num_frames=4, check_records=True)
    with pytest.raises(packer.FormatError, match=r"sample 1 \("):
        damaged[1]


def test_the_option_pickles_and_a_worker_refuses(outputs: dict[str, Path], tmp_path: Path) -> None:
    root, _ = flipped(outputs[".lmdb"], tmp_path / "damaged.lmdb")
    checked = packer.open_dataset(root, output="bytes", check_records=True)
    again = pickle.loads(pickle.dumps(checked))
    with pytest.raises(packer.FormatError, match=f"sample {FLIPPED} "):
        again[FLIPPED]
    plain = pickle.loads(pickle.dumps(packer.open_dataset(root, output="bytes")))
    plain[FLIPPED]  # without the option the copy serves it too
    loader = DataLoader(
        checked,
        batch_size=2,
        num_workers=2,
        multiprocessing_context="forkserver",  # the dataset pickled, as under spawn
        collate_fn=as_list,
    )
    with pytest.raises(packer.FormatError, match=f"sample {FLIPPED} "):
        for _ in loader:
            pass
    served = DataLoader(
        packer.open_dataset(root, output="bytes"),
        batch_size=2,
        num_workers=2,
        multiprocessing_context="forkserver",
        collate_fn=as_list,
    )
    assert sum(len(batch) for batch in served) == len(checked)


def test_a_field_is_checked_in_an_hdf5_output(tmp_path: Path) -> None:
    make_caption_set(tmp_path / "src", samples=8)
    out = packer.convert(tmp_path / "src", tmp_path / "c.h5", progress=False).dst
    plain = packer.open_dataset(out)
    checked = packer.open_dataset(out, check_records=True)
    assert [plain[i] for i in range(len(plain))] == [checked[i] for i in range(len(checked))]
    caption = plain.fields.index("txt")
    root, _ = flipped(out, tmp_path / "damaged.h5", nth=caption, bits=0x01)  # still text
    served = packer.open_dataset(root)
    assert served[FLIPPED] != plain[FLIPPED]  # the default serves the changed caption
    with pytest.raises(packer.FormatError, match=rf"sample {FLIPPED} \('{plain.keys[FLIPPED]}'\)"):
        packer.open_dataset(root, check_records=True)[FLIPPED]


def test_a_plain_folder_refuses_the_option(outputs: dict[str, Path]) -> None:
    with pytest.raises(packer.PackerError, match="check_records applies to a packed dataset"):
        packer.open_dataset(outputs["folder"], check_records=True)
