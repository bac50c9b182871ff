"""COCO attacked (issue 41): each crafted entry is that image's skip with its reason or a clear
refusal, never an internal error; a FIFO is refused without blocking; the same file twice or
a duplicated annotation never duplicates data; keypoint categories keep their keypoints; a
resume after any annotations file changed is refused naming that file (issue 40's coco.py:72)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.demo.fields import make_coco_set
from packer.errors import SourceError


def _set(tmp_path: Path, images: int = 4) -> tuple[Path, dict[str, Any]]:
    written = make_coco_set(tmp_path / "coco", images=images)
    return tmp_path / "coco", written


def _write(root: Path, name: str, content: Any) -> str:
    path = root / name
    path.write_text(json.dumps(content) if not isinstance(content, str) else content)
    return str(path)


def _convert(root: Path, out: Path, files: list[str]) -> Any:
    return packer.convert(root / "images", out, annotations=files, progress=False)


def _cli(root: Path, out: Path, files: list[str]) -> Any:
    args = ["convert", str(root / "images"), str(out)]
    for f in files:
        args += ["--annotations", f]
    return CliRunner().invoke(main, args)


@pytest.mark.parametrize(
    "field, value",
    [("file_name", "\ud800.jpg"), ("file_name", "a\x00.jpg"), ("coco_url", "http://\udcff")],
)
def test_a_bad_string_in_an_image_entry_skips_that_image(
    tmp_path: Path, field: str, value: str
) -> None:
    root, written = _set(tmp_path)
    inst = written["instances"]
    inst["images"][0][field] = value
    path = _write(root, "instances.json", inst)
    result = _convert(root, tmp_path / "o.lmdb", [path])
    assert result.manifest.num_samples == 3
    assert len(result.skipped) == 1
    assert "surrogate" in result.skipped[0].reason or "NUL" in result.skipped[0].reason


def test_a_caption_with_a_lone_surrogate_or_not_text_skips_its_image(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    caps = written["captions"]
    caps["annotations"][0]["caption"] = "\ud800"
    caps["annotations"][2]["caption"] = {"a": 1}
    caps["annotations"][4]["caption"] = None
    path = _write(root, "captions.json", caps)
    result = _convert(root, tmp_path / "o.lmdb", [path])
    assert result.manifest.num_samples == 1
    reasons = sorted(s.reason for s in result.skipped)
    assert sum("not text" in r for r in reasons) == 2 and any("surrogate" in r for r in reasons)


def test_coco_nested_thousands_deep_is_refused_not_an_internal_error(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    inst = json.dumps(written["instances"])[:-1] + ', "deep": ' + "[" * 6000 + "]" * 6000 + "}"
    path = _write(root, "instances.json", inst)
    got = _cli(root, tmp_path / "o.lmdb", [path])
    assert got.exit_code == 1 and "nested too deep" in got.output, got.output
    assert "internal error" not in got.output


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda d: d.update(categories=[1]), "not an object"),
        (lambda d: d["categories"].append({"id": -1, "name": "neg"}), "outside 0.."),
        (lambda d: d["categories"].append({"id": 2**63, "name": "big"}), "outside 0.."),
        (lambda d: d["categories"].append({"id": True, "name": "bool"}), "integer id"),
    ],
)
def test_a_bad_category_is_refused_at_conversion(tmp_path: Path, change: Any, said: str) -> None:
    root, written = _set(tmp_path)
    change(written["instances"])
    path = _write(root, "instances.json", written["instances"])
    got = _cli(root, tmp_path / "o.lmdb", [path])
    assert got.exit_code == 1 and said in got.output, got.output
    assert not (tmp_path / "o.lmdb").exists()


def test_a_list_as_image_or_category_id_skips_that_annotation_or_image(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    inst = written["instances"]
    inst["annotations"][0]["image_id"] = [1]
    bad = next(a for a in inst["annotations"] if a["image_id"] == 2)
    bad["category_id"] = [1]
    path = _write(root, "instances.json", inst)
    result = _convert(root, tmp_path / "o.lmdb", [path])
    reasons = [s.reason for s in result.skipped]
    assert any("names image [1]" in r for r in reasons)
    assert any("names category [1]" in r for r in reasons)
    assert result.manifest.num_samples == 3


def test_an_image_id_true_is_not_image_1(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    inst = written["instances"]
    inst["images"].append(dict(inst["images"][0], id=True))
    path = _write(root, "instances.json", inst)
    with pytest.raises(SourceError, match="without an integer 'id'"):
        _convert(root, tmp_path / "o.lmdb", [path])


def test_an_image_id_listed_twice_with_two_file_names_is_refused(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    inst = written["instances"]
    inst["images"].append(dict(inst["images"][1], id=1))
    path = _write(root, "instances.json", inst)
    with pytest.raises(SourceError, match="image 1 is '000000000002.jpg' here"):
        _convert(root, tmp_path / "o.lmdb", [path])


def test_an_image_listed_twice_with_other_metadata_is_a_listed_skip(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    inst = written["instances"]
    inst["images"].append(dict(inst["images"][0], width=999))
    path = _write(root, "instances.json", inst)
    result = _convert(root, tmp_path / "o.lmdb", [path])
    assert result.manifest.num_samples == 3
    assert [s.reason for s in result.skipped] == ["image 1 is listed twice with different entries"]


def test_the_same_file_twice_is_refused(tmp_path: Path) -> None:
    root, _ = _set(tmp_path)
    inst = str(root / "instances.json")
    os.link(inst, root / "again.json")
    for second in (inst, str(root / "again.json")):
        with pytest.raises(SourceError, match="given twice"):
            _convert(root, tmp_path / "o.lmdb", [inst, second])


def test_annotations_shared_by_two_files_are_kept_once_or_refused(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    inst = written["instances"]
    copy = _write(
        root, "copy.json", {"images": inst["images"], "annotations": inst["annotations"][:2]}
    )
    result = _convert(root, tmp_path / "o.lmdb", [str(root / "instances.json"), copy])
    ds = packer.open_dataset(result.dst, fields=("meta", "annotations"))
    notes = [n for i in range(len(ds)) for n in ds[i][1]]
    assert sorted(n["id"] for n in notes) == sorted(a["id"] for a in inst["annotations"])
    assert sum("the same annotation" in s.reason for s in result.skipped) == 2
    inst["annotations"][0]["bbox"] = [0, 0, 1, 1]
    other = _write(
        root, "other.json", {"images": inst["images"], "annotations": inst["annotations"][:1]}
    )
    with pytest.raises(SourceError, match="differs from the one"):
        _convert(root, tmp_path / "p.lmdb", [str(root / "instances.json"), other])


def test_keypoint_categories_keep_keypoints_and_skeleton(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    inst = written["instances"]
    inst["categories"][0].update(keypoints=["nose", "eye"], skeleton=[[1, 2]])
    path = _write(root, "instances.json", inst)
    result = _convert(root, tmp_path / "o.lmdb", [path])
    cat = packer.open_dataset(result.dst).manifest.options["categories"][0]
    assert cat["keypoints"] == ["nose", "eye"] and cat["skeleton"] == [[1, 2]]


def test_annotations_naming_a_fifo_are_refused_without_blocking(tmp_path: Path) -> None:
    root, _ = _set(tmp_path)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    done = threading.Event()
    got: list[Any] = []

    def run() -> None:
        got.append(_cli(root, tmp_path / "o.lmdb", [str(fifo)]))
        done.set()

    threading.Thread(target=run, daemon=True).start()
    if not done.wait(120):  # a hang; unblock the reader so the thread ends
        with open(fifo, "w"):
            pass
        pytest.fail("--annotations naming a FIFO blocked")
    assert got[0].exit_code == 1 and "not a regular file" in got[0].output, got[0].output


@pytest.mark.parametrize("what", ["panoptic", "no categories"])
def test_every_image_skipped_says_why(tmp_path: Path, what: str) -> None:
    root, written = _set(tmp_path)
    inst = written["instances"]
    if what == "panoptic":
        for a in inst["annotations"]:
            a["segments_info"] = [{"id": 1, "category_id": a.pop("category_id")}]
    else:
        del inst["categories"]
    inst["images"] = inst["images"][:-1]  # the last image has no annotation
    path = _write(root, "instances.json", inst)
    with pytest.raises(SourceError) as caught:
        _convert(root, tmp_path / "o.lmdb", [path])
    said = str(caught.value)
    assert "panoptic" in said if what == "panoptic" else "do not list" in said, said
    assert "3 skipped" in said


KILLER = """
import os, signal, sys
import packer
src, dst, *files = sys.argv[1:]
def on_event(name, n):
    if name == "shard" and n == 1:
        os.kill(os.getpid(), signal.SIGKILL)
packer.convert(src, dst, annotations=files, shard_size="2kB", progress=False, on_event=on_event)
"""


def test_resume_after_the_second_annotations_file_changed_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    root, written = _set(tmp_path, images=8)
    files = [str(root / "instances.json"), str(root / "captions.json")]
    out = tmp_path / "o.lmdb"
    cmd = [sys.executable, "-c", KILLER, str(root / "images"), str(out), *files]
    assert subprocess.run(cmd, capture_output=True).returncode == -9
    assert Path(f"{out}.partial").is_dir()
    caps = written["captions"]
    caps["annotations"][0]["caption"] = "changed"
    _write(root, "captions.json", caps)
    args = ["convert", str(root / "images"), str(out), "--resume", "--shard-size", "2kB"]
    got = CliRunner().invoke(main, [*args, "--annotations", files[0], "--annotations", files[1]])
    assert got.exit_code == 1, got.output
    assert "captions.json" in got.output and ".jpg" not in got.output, got.output


def test_an_image_file_that_is_a_fifo_skips_its_sample_whole(tmp_path: Path) -> None:
    root, written = _set(tmp_path)
    name = written["instances"]["images"][0]["file_name"]
    os.remove(root / "images" / name)
    os.mkfifo(root / "images" / name)
    result = _convert(root, tmp_path / "o.lmdb", [str(root / "instances.json")])
    assert result.manifest.num_samples == 3
    assert [s.path.endswith(name) for s in result.skipped] == [True]
    assert "regular file" in result.skipped[0].reason, result.skipped[0].reason
