"""COCO as a source (issue 30): an image folder with its instances and captions JSON converts
to LMDB, NPY and HDF5; every image's annotations (boxes, polygons, RLE), captions and entry
read back equal to the files', images without annotations kept, the categories in the
manifest; a write-time resize refused; bad annotations skipped or refused with their reason."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from torch.utils.data import DataLoader

import packer
from packer.cli import main
from packer.demo.fields import make_coco_set


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("coco")
    return root, make_coco_set(root, images=10)


def _annotations(root: Path) -> list[str]:
    return [str(root / "instances.json"), str(root / "captions.json")]


@pytest.mark.parametrize("suffix", [".lmdb", ".npy", ".h5"])
def test_coco_reads_back_equal_to_its_files_through_workers(
    suffix: str, coco: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, files = coco
    result = packer.convert(
        root / "images", tmp_path / f"c{suffix}", annotations=_annotations(root), progress=False
    )
    assert not result.skipped and result.manifest.num_samples == 10
    ds = packer.open_dataset(result.dst, fields=("meta", "annotations", "captions"))
    assert ds.categories == {1: "dog", 2: "café"}
    loader = DataLoader(
        ds,
        batch_size=3,
        num_workers=2,
        collate_fn=packer.collate_fields,
        multiprocessing_context="forkserver" if suffix == ".h5" else "fork",
    )
    seen = 0
    for metas, notes, captions in loader:
        for meta, note, caption in zip(metas, notes, captions):
            image_id = meta["id"]
            assert meta == files["instances"]["images"][image_id - 1]
            want = [a for a in files["instances"]["annotations"] if a["image_id"] == image_id]
            assert note == want  # bbox, category, iscrowd, area, polygons or RLE: all kept
            assert caption == [
                c["caption"] for c in files["captions"]["annotations"] if c["image_id"] == image_id
            ]
            seen += 1
    assert seen == 10
    assert packer.open_dataset(result.dst, fields=("annotations",))[9] == ([],)  # kept, empty
    raw = packer.FieldDataset(result.dst, fields=("image",), output="bytes")
    assert raw[0][0] == (root / "images" / "000000000001.jpg").read_bytes()


def test_resize_refused_for_pixel_coordinates(
    coco: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root = coco[0]
    args = ["convert", str(root / "images"), str(tmp_path / "o.lmdb"), "--short-side", "32"]
    got = CliRunner().invoke(main, [*args, "--annotations", str(root / "instances.json")])
    assert got.exit_code != 0 and "pixel coordinates" in got.output
    assert not (tmp_path / "o.lmdb").exists()


def test_bad_annotations_skipped_with_their_reason(
    coco: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, files = coco
    bad = json.loads(json.dumps(files["instances"]))
    bad["annotations"].append({"id": 900, "image_id": 4242, "category_id": 1, "bbox": [0, 0, 1, 1]})
    bad["annotations"].append({"id": 901, "image_id": 2, "category_id": 77, "bbox": [0, 0, 1, 1]})
    bad["images"].append({"id": 50, "file_name": "gone.jpg"})
    bad["images"].append({"id": 51, "file_name": "../../etc/passwd"})
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    result = packer.convert(root / "images", tmp_path / "o.npy", annotations=[path], progress=False)
    reasons = {s.path.rsplit("/", 1)[-1]: s.reason for s in result.skipped}
    assert reasons["bad.json: annotation 900"] == "names image 4242, not listed"
    assert "names category 77" in reasons["000000000002.jpg"]  # its boxes would be wrong
    assert "No such file" in reasons["gone.jpg"]
    assert "outside the image folder" in reasons["passwd"]
    keys = list(packer.FieldDataset(result.dst).keys)
    assert len(keys) == 9 and "000000000002" not in keys


def test_bad_coco_files_refused_in_one_line(
    coco: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, files = coco
    other = json.loads(json.dumps(files["instances"]))
    other["categories"][0]["name"] = "cat"
    clash = tmp_path / "clash.json"
    clash.write_text(json.dumps(other))
    broken = tmp_path / "broken.json"
    broken.write_text('{"images": [')
    notcoco = tmp_path / "list.json"
    notcoco.write_text("[1, 2]")
    cases = [
        ([root / "instances.json", clash], "category 1 is 'cat' here and 'dog'"),
        ([broken], "is not JSON"),
        ([notcoco], "is not a COCO file"),
    ]
    for files_given, message in cases:
        args = ["convert", str(root / "images"), str(tmp_path / "o.lmdb"), "-q"]
        for a in files_given:
            args += ["--annotations", str(a)]
        got = CliRunner().invoke(main, args)
        assert got.exit_code != 0 and message in got.output, got.output
        assert "Traceback" not in got.output
    got = CliRunner().invoke(
        main, ["convert", str(root / "images"), str(tmp_path / "p.lmdb"), "--kind", "coco"]
    )
    assert got.exit_code != 0 and "needs its annotations" in got.output
