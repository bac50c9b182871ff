"""Links in sources, attacked (issue 41, item 2): a field file or folder reached through a link
that leaves the source root is skipped with its reason unless --follow-links, checked on the
opened descriptor (a link swapped after the scan too); a link that stays inside is read; a
symlink loop anywhere is skipped and listed, never an abort; an unusable field file skips its
whole sample (W9)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import packer
from packer.cli import main
from packer.demo.fields import make_caption_set, make_coco_set, write_table
from packer.source.links import OUTSIDE


def _reasons(result: packer.ConvertResult) -> dict[str, str]:
    return {os.path.basename(s.path): s.reason for s in result.skipped}


def _texts(out: Path) -> list[str]:
    ds = packer.open_dataset(out)
    return [ds[i]["txt"] for i in range(len(ds))]


@pytest.fixture
def grouped(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    make_caption_set(src, samples=5)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    (src / ".store").mkdir()
    (src / ".store" / "kept.txt").write_text("inside the source\n")
    for key, target in [
        ("000000", "/etc/hostname"),
        ("000001", "../outside/secret.txt"),
        ("000002", "/proc/self/environ"),
        ("000003", ".store/kept.txt"),
    ]:
        os.remove(src / f"{key}.txt")
        os.symlink(target, src / f"{key}.txt")
    return src


def test_grouped_links_leaving_the_root_are_skipped_and_counted(
    grouped: Path, tmp_path: Path
) -> None:
    result = packer.convert(grouped, tmp_path / "o.lmdb", progress=False, workers=1)
    reasons = _reasons(result)
    for key in ("000000", "000001", "000002"):
        assert reasons[f"{key}.*"].startswith(f"field 'txt': {OUTSIDE}"), reasons
    assert sorted(_texts(tmp_path / "o.lmdb")) == sorted(
        ["inside the source\n", (grouped / "000004.txt").read_text()]
    )
    note = [n for n in result.notes if "--follow-links" in n]
    assert note and note[0].startswith("3 input(s)"), result.notes
    assert "--follow-links" in result.summary()


def test_follow_links_reads_them(grouped: Path, tmp_path: Path) -> None:
    os.remove(grouped / "000002.txt")  # the environment is not a caption
    os.symlink("/proc/self/environ", grouped / "000002.txt.skipme")
    result = packer.convert(
        grouped, tmp_path / "o.lmdb", progress=False, workers=1, follow_links=True
    )
    texts = _texts(tmp_path / "o.lmdb")
    assert "top secret\n" in texts and "inside the source\n" in texts
    assert not [s for s in result.skipped if OUTSIDE in s.reason]
    assert result.manifest.options.get("follow_links") is True


def test_a_link_swapped_after_the_scan_is_checked_on_the_descriptor(
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    make_caption_set(src, samples=3)
    (tmp_path / "secret.txt").write_text("top secret\n")

    def swap(name: str, number: int) -> None:
        if name == "sample" and number == 0:  # sample 1 is loaded after sample 0 is written
            os.remove(src / "000001.txt")
            os.symlink(tmp_path / "secret.txt", src / "000001.txt")

    result = packer.convert(src, tmp_path / "o.npy", progress=False, workers=1, on_event=swap)
    assert "top secret\n" not in _texts(tmp_path / "o.npy")
    assert _reasons(result)["000001.*"].startswith(f"field 'txt': {OUTSIDE}")


def _table(tmp_path: Path) -> Path:
    samples = make_caption_set(tmp_path / "made", samples=3)
    table = write_table(samples, tmp_path / "t" / "table.csv")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "000000.jpg").write_bytes(samples["000000"]["jpg"])
    os.remove(table.parent / "images" / "000000.jpg")
    os.symlink(outside / "000000.jpg", table.parent / "images" / "000000.jpg")
    os.symlink(outside, table.parent / "linked")
    rows = list(csv.DictReader(table.open()))
    rows[1]["image"] = "linked/000000.jpg"  # a linked folder leaving the root
    with table.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return table


def test_table_image_paths_through_links_leaving_the_root(tmp_path: Path) -> None:
    table = _table(tmp_path)
    result = packer.convert(table, tmp_path / "o.lmdb", progress=False, workers=1)
    outside = [s for s in result.skipped if OUTSIDE in s.reason]
    assert len(outside) == 2, result.skipped
    assert result.manifest.num_samples == 1
    again = packer.convert(table, tmp_path / "f.lmdb", progress=False, workers=1, follow_links=True)
    assert again.manifest.num_samples == 3


def test_coco_file_name_through_a_link_leaving_the_root(tmp_path: Path) -> None:
    root = tmp_path / "coco"
    make_coco_set(root, images=3)
    name = root / "images" / "000000000001.jpg"
    moved = tmp_path / "moved.jpg"
    name.rename(moved)
    os.symlink(moved, name)
    inside = root / "images" / "000000000002.jpg"
    (root / "images" / ".kept").mkdir()
    inside.rename(root / "images" / ".kept" / "two.jpg")
    os.symlink(".kept/two.jpg", inside)  # stays inside: read
    notes = [str(root / "instances.json")]
    result = packer.convert(
        root / "images", tmp_path / "o.lmdb", progress=False, workers=1, annotations=notes
    )
    assert [s.path for s in result.skipped if OUTSIDE in s.reason] == [str(name)]
    assert result.manifest.num_samples == 2


def test_cli_follow_links_flag(grouped: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    assert "--follow-links" in runner.invoke(main, ["convert", "--help"]).output
    shown = runner.invoke(main, ["convert", str(grouped), str(tmp_path / "o.lmdb"), "--json"])
    assert shown.exit_code == 0, shown.output
    skipped = json.loads(shown.output)["skipped"]
    assert sum(OUTSIDE in s["reason"] for s in skipped) == 3
    os.remove(grouped / "000002.txt")
    shown = runner.invoke(
        main, ["convert", str(grouped), str(tmp_path / "f.lmdb"), "--follow-links", "-q"]
    )
    assert shown.exit_code == 0, shown.output
    assert "top secret\n" in _texts(tmp_path / "f.lmdb")


def test_symlink_loops_at_the_top_of_a_source_are_skipped_and_listed(tmp_path: Path) -> None:
    from packer.demo.image import make_image_tree
    from packer.demo.video import make_video_tree

    trees = {"cls": tmp_path / "cls", "vid": tmp_path / "vid", "grp": tmp_path / "grp"}
    make_image_tree(trees["cls"], classes=2, per_class=2, size=(64, 48), bad=0)
    make_video_tree(trees["vid"])
    make_caption_set(trees["grp"], samples=3)
    for name, root in trees.items():
        os.symlink("loop", root / "loop")
        kind = "video" if name == "vid" else None
        result = packer.convert(root, tmp_path / f"{name}.lmdb", progress=False, kind=kind)
        assert _reasons(result)["loop"] == "symlink loop (not followed)", name


def test_loops_inside_a_class_and_grouped_field_loops(tmp_path: Path) -> None:
    from packer.demo.image import make_image_tree

    make_image_tree(tmp_path / "cls", classes=2, per_class=2, size=(64, 48), bad=0)
    os.symlink("deep", tmp_path / "cls" / "class_00" / "deep")
    result = packer.convert(tmp_path / "cls", tmp_path / "c.lmdb", progress=False)
    assert _reasons(result)["deep"] == "symlink loop (not followed)"
    make_caption_set(tmp_path / "grp", samples=3)
    os.remove(tmp_path / "grp" / "000001.txt")
    os.symlink("000001.txt", tmp_path / "grp" / "000001.txt")
    result = packer.convert(tmp_path / "grp", tmp_path / "g.lmdb", progress=False)
    assert _reasons(result)["000001.*"] == "field 'txt': '000001.txt': symlink loop (not followed)"
    assert result.manifest.num_samples == 2


@pytest.mark.parametrize("what", ["fifo", "socket", "dangling"])
def test_an_unusable_field_file_skips_its_whole_sample(tmp_path: Path, what: str) -> None:
    import socket

    src = tmp_path / "src"
    make_caption_set(src, samples=3)
    bad = src / "000001.txt"
    os.remove(bad)
    if what == "fifo":
        os.mkfifo(bad)
    elif what == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(bad))
    else:
        os.symlink(tmp_path / "gone.txt", bad)
    result = packer.convert(src, tmp_path / "o.lmdb", progress=False, workers=1)
    assert "field 'txt': '000001.txt'" in _reasons(result)["000001.*"]
    ds = packer.open_dataset(tmp_path / "o.lmdb")
    assert len(ds) == 2 and all(ds[i]["txt"] is not None for i in range(2))


def test_a_fifo_swapped_in_after_the_scan_never_blocks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_caption_set(src, samples=3)

    def swap(name: str, number: int) -> None:
        if name == "sample" and number == 0:
            os.remove(src / "000001.txt")
            os.mkfifo(src / "000001.txt")  # no writer: a blocking open would wait for ever

    result = packer.convert(src, tmp_path / "o.lmdb", progress=False, workers=1, on_event=swap)
    assert "not a regular file" in _reasons(result)["000001.*"]


def test_links_checked_in_a_process_pool_too(grouped: Path, tmp_path: Path) -> None:
    result = packer.convert(
        grouped, tmp_path / "o.h5", progress=False, workers=2, check="decode"
    )  # a decoding check: loaded in a process pool, the loader pickled
    assert sum(OUTSIDE in s.reason for s in result.skipped) == 3
    assert "top secret\n" not in _texts(tmp_path / "o.h5")


def test_a_source_that_is_itself_a_loop_says_so(tmp_path: Path) -> None:
    os.symlink("src", tmp_path / "src")
    shown = CliRunner().invoke(main, ["convert", str(tmp_path / "src"), str(tmp_path / "o.lmdb")])
    assert shown.exit_code != 0 and "symbolic link loop" in shown.output, shown.output
    os.symlink("dst.lmdb", tmp_path / "dst.lmdb")
    (tmp_path / "ok").mkdir()
    shown = CliRunner().invoke(main, ["convert", str(tmp_path / "ok"), str(tmp_path / "dst.lmdb")])
    assert shown.exit_code != 0 and "symbolic link loop" in shown.output, shown.output
