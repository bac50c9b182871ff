"""Samples with named fields (issue 30): key-grouped files packed into LMDB, NPY and HDF5 and
read back field for field equal to the source, through DataLoader workers, a caption-only pass,
verify, resume, a URL; bad input skipped with its reason or refused in one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from s3_server import S3Server
from torch.utils.data import DataLoader

import packer
from packer.cli import main
from packer.demo.fields import make_caption_set
from packer.transforms import RandomResizedCrop

BUCKET = "fields"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("captions") / "src"
    written = make_caption_set(root, samples=24)
    (root / "000003.txt").write_bytes(b"")  # an empty caption: present, ""
    written["000003"]["txt"] = b""
    return root, written


@pytest.fixture(scope="module")
def outputs(
    source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("packed")
    return {
        s: packer.convert(source[0], out / f"c{s}", progress=False).dst
        for s in (".lmdb", ".npy", ".h5")
    }


def _expected(fields: dict[str, bytes]) -> dict[str, object]:
    return {
        "jpg": fields["jpg"],
        "txt": fields["txt"].decode(),
        "cls": int(fields["cls"]),
        "json": json.loads(fields["json"]) if "json" in fields else None,
    }


@pytest.mark.parametrize("suffix", [".lmdb", ".npy", ".h5"])
def test_every_format_reads_back_field_for_field_through_workers(
    suffix: str, source: tuple[Path, dict[str, dict[str, bytes]]], outputs: dict[str, Path]
) -> None:
    ds = packer.open_dataset(
        outputs[suffix], transform={"jpg": lambda im: im.tobytes()}, output="pil"
    )
    assert isinstance(ds, packer.FieldDataset)
    assert ds.fields == ("cls", "jpg", "json", "txt")
    raw = packer.FieldDataset(outputs[suffix], output="bytes")
    loader = DataLoader(
        packer.open_dataset(outputs[suffix], fields=("jpg", "txt", "cls", "json")),
        batch_size=5,
        num_workers=2,
        collate_fn=packer.collate_fields,
        multiprocessing_context="fork",
    )
    seen = 0
    for jpgs, txts, clss, jsons in loader:
        for jpg, txt, cls, meta in zip(jpgs, txts, clss.tolist(), jsons):
            key = raw.keys[seen]
            want = _expected(source[1][key])
            assert (txt, cls, meta) == (want["txt"], want["cls"], want["json"])
            assert raw[seen]["jpg"] == want["jpg"]  # the stored bytes are the source's
            assert jpg.size == (96, 72)
            seen += 1
    assert seen == len(source[1]) == len(ds)
    assert ds[3]["txt"] == "" and ds[1]["json"] is None  # empty and absent stay apart


@pytest.mark.parametrize("context", ["fork", "forkserver"])  # spawn: test_field_transport.py
def test_workers_under_every_start_method(context: str, outputs: dict[str, Path]) -> None:
    ds = packer.open_dataset(outputs[".lmdb"], output="numpy")
    loader = DataLoader(
        ds,
        batch_size=8,
        num_workers=2,
        collate_fn=packer.collate_fields,
        multiprocessing_context=context,
    )
    batches = list(loader)
    assert sum(len(b["__key__"]) for b in batches) == len(ds)
    assert batches[0]["jpg"].shape == (8, 72, 96, 3)  # one shape: stacked
    assert batches[0]["json"][1] is None and isinstance(batches[0]["txt"], list)


def test_a_caption_pass_reads_only_the_captions(outputs: dict[str, Path]) -> None:
    ds = packer.open_dataset(outputs[".npy"], fields=("txt",))
    asked: list[int] = []
    read_many = ds.reader.read_many

    def spy(records):  # the real reader still reads: this only counts what it is asked
        asked.extend(np.asarray(records).tolist())
        return read_many(records)

    ds.reader.read_many = spy  # type: ignore[method-assign]
    captions = [c for (c,) in ds.__getitems__(list(range(len(ds))))]
    moved = int(ds.reader.length[asked].sum())
    total = int(ds.reader.length.sum())
    assert moved == sum(len(c.encode()) for c in captions)
    assert moved < 0.05 * total


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photos") / "src"
    make_caption_set(root, samples=100, size=(400, 350))  # 8 MB: room for the readahead
    return root


@pytest.mark.parametrize("suffix", [".npy", ".lmdb"])
def test_a_caption_pass_leaves_the_images_on_disk(
    suffix: str, photos: Path, tmp_path: Path
) -> None:
    from packer.diagnosis.io_counters import resident_fraction
    from packer.diagnosis.targets import evict_page_cache

    dst = packer.convert(photos, tmp_path / f"big{suffix}", progress=False).dst
    shards = sorted(str(p) for p in dst.glob("shard-*"))
    assert shards and evict_page_cache(shards) == len(shards)
    cold = resident_fraction(shards)
    if cold is None or cold > 0.05:
        pytest.fail(f"cannot evict the shards here (resident {cold}): the check would mean nothing")
    loader = DataLoader(
        packer.open_dataset(dst, fields=("txt",)), batch_size=16, shuffle=True, num_workers=2,
        collate_fn=packer.collate_fields, multiprocessing_context="fork",
    )  # fmt: skip
    assert sum(len(texts) for (texts,) in loader) == 100
    after = resident_fraction(shards)
    assert after is not None and after < 0.2  # the caption pages, not the images beside them


def test_verify_finds_a_flipped_caption_byte(outputs: dict[str, Path], tmp_path: Path) -> None:
    assert packer.verify(outputs[".npy"], full=True).ok  # absent fields are sound
    copy = tmp_path / "c.npy"
    shutil.copytree(outputs[".npy"], copy)
    ds = packer.open_dataset(copy)
    record = int(ds.first[5]) + ds.fields.index("txt")
    offset = int(ds.reader.offset[record])
    shard = copy / "shard-00000.npy"
    data = bytearray(shard.read_bytes())
    data[offset] ^= 0x01
    shard.write_bytes(bytes(data))
    report = packer.verify(copy)
    assert not report.ok
    assert any(ds.keys[5] in p.where or ds.keys[5] in p.what for p in report.problems)


def test_output_is_the_same_for_any_worker_count(
    source: tuple[Path, dict[str, dict[str, bytes]]], tmp_path: Path
) -> None:
    one = packer.convert(source[0], tmp_path / "a.lmdb", workers=1, progress=False).dst
    three = packer.convert(source[0], tmp_path / "b.lmdb", workers=3, progress=False).dst
    for name in ("shard-00000.mdb", "index.npy", "records.npy", "keys.txt"):
        assert (one / name).read_bytes() == (three / name).read_bytes()


def test_a_field_dataset_at_a_url_reads_back_exact(
    server: S3Server, outputs: dict[str, Path]
) -> None:
    local = packer.open_dataset(outputs[".npy"], output="bytes")
    url = server.upload(outputs[".npy"], "c.npy")
    for cache in (False, True):
        remote = packer.open_dataset(
            url,
            output="bytes",
            storage_options=server.options,
            cache=cache,
            cache_dir=str(Path(os.environ.get("TMPDIR", "/tmp")) / f"fc-{os.getpid()}"),
        )
        assert isinstance(remote, packer.FieldDataset)
        assert remote.__getitems__(list(range(len(local)))) == local.__getitems__(
            list(range(len(local)))
        )


def test_bad_fields_skip_their_sample_with_the_reason(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_caption_set(src, samples=8)
    (src / "000000.txt").write_bytes(b"caf\xe9")  # Latin-1, not UTF-8
    (src / "000002.json").write_bytes(b"{not json")
    (src / "000004.cls").write_bytes(b"seven")
    (src / "000005.TXT").write_bytes(b"a second caption")  # two files for field txt
    (src / "000006.jpg").write_bytes((src / "000006.jpg").read_bytes()[:200])  # truncated
    (src / "000007 x.txt").write_bytes(b"x")  # a key of its own (with a space)
    (src / "000001.J PG").write_bytes(b"x")  # a field name that is not plain
    result = packer.convert(src, tmp_path / "o.lmdb", progress=False)
    reasons = {os.path.basename(s.path): s.reason for s in result.skipped}
    assert "not UTF-8 text (byte 3 is 0xe9)" in reasons["000000.*"]
    assert "not JSON" in reasons["000002.*"]
    assert "not an integer" in reasons["000004.*"]
    assert "two files for field 'txt'" in reasons["000005.*"]
    assert reasons["000006.*"].startswith("field 'jpg'")
    assert "not a plain name" in reasons["000001.J PG"]
    ds = packer.open_dataset(result.dst)
    assert sorted(ds.keys[i] for i in range(len(ds))) == ["000001", "000003", "000007", "000007 x"]


def test_keys_that_differ_only_by_case_are_both_skipped(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_caption_set(src, samples=3)
    (src / "A1.txt").write_bytes(b"one")
    (src / "a1.txt").write_bytes(b"two")
    result = packer.convert(src, tmp_path / "o.npy", progress=False)
    assert sorted(os.path.basename(s.path) for s in result.skipped) == ["A1.*", "a1.*"]
    assert all("differs only by case" in s.reason for s in result.skipped)
    assert len(packer.open_dataset(result.dst)) == 3


def test_ten_thousand_fields_is_one_clear_error(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(10_000):
        (src / f"0001.f{i}").write_bytes(b"")
    result = CliRunner().invoke(main, ["convert", str(src), str(tmp_path / "o.lmdb")])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "10000 distinct field names, more than 256" in result.output


def test_require_skips_samples_without_the_field(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_caption_set(src, samples=6)
    result = packer.convert(src, tmp_path / "o.h5", require=["json"], progress=False)
    assert len(packer.open_dataset(result.dst)) == 3
    assert {s.reason for s in result.skipped} == {"no 'json' field (--require)"}
    with pytest.raises(packer.SourceError, match="no sample of .* has a field 'seg.png'"):
        packer.convert(src, tmp_path / "p.h5", require=["seg.png"], progress=False)


def test_a_tree_that_could_be_either_kind_is_refused(tmp_path: Path) -> None:
    make_caption_set(tmp_path / "src" / "part0", samples=3)
    with pytest.raises(packer.SourceError, match="could be either kind.*--kind files"):
        packer.convert(tmp_path / "src", tmp_path / "o.lmdb", progress=False)
    done = packer.convert(tmp_path / "src", tmp_path / "o.lmdb", kind="files", progress=False)
    assert packer.open_dataset(done.dst).keys[0] == "part0/000000"


def test_resize_is_refused_where_geometry_would_break(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_caption_set(src, samples=3)
    small = packer.convert(src, tmp_path / "s.lmdb", short_side=36, progress=False)
    assert packer.open_dataset(small.dst)[0]["jpg"].size == (48, 36)
    (src / "000000.seg.png").write_bytes(b"")  # a second image field: a mask
    with pytest.raises(packer.PackerError, match="2 image fields"):
        packer.convert(src, tmp_path / "t.lmdb", short_side=36, progress=False)
    with pytest.raises(packer.PackerError, match="BMP stores one decoded image per file"):
        packer.convert(src, tmp_path / "t.bmp", progress=False)


def test_reading_errors_name_what_exists(outputs: dict[str, Path]) -> None:
    with pytest.raises(packer.PackerError, match="no field 'caption'; its fields are cls, jpg"):
        packer.open_dataset(outputs[".lmdb"], fields=("caption",))
    with pytest.raises(packer.FormatError, match="holds samples with fields, not images"):
        packer.open_dataset(outputs[".lmdb"], kind="image")
    with pytest.raises(packer.FormatError, match="holds samples with fields, not images"):
        packer.LMDBDataset(outputs[".lmdb"])


def test_sharded_sampler_resume_is_exact(outputs: dict[str, Path]) -> None:
    ds = packer.open_dataset(outputs[".lmdb"], fields=("txt",))
    whole = list(packer.ShardedSampler(ds, num_replicas=1, rank=0, seed=3))
    sampler = packer.ShardedSampler(ds, num_replicas=1, rank=0, seed=3)
    state = sampler.state_dict(consumed=10)
    again = packer.ShardedSampler(ds, num_replicas=1, rank=0, seed=3)
    again.load_state_dict(state)
    assert list(again) == whole[10:]


def test_inspect_shows_each_field_with_its_count_and_bytes(outputs: dict[str, Path]) -> None:
    shown = CliRunner().invoke(main, ["inspect", str(outputs[".h5"])])
    assert shown.exit_code == 0, shown.output
    assert "samples with fields" in shown.output
    assert "field json (json): 12 samples" in shown.output  # every other sample has one
    assert "field txt (text): 24 samples" in shown.output
    as_json = json.loads(
        CliRunner().invoke(main, ["inspect", str(outputs[".h5"]), "--json"]).output
    )
    assert [f["name"] for f in as_json["fields"]] == ["cls", "jpg", "json", "txt"]


def test_bench_and_doctor_measure_the_image_field(outputs: dict[str, Path]) -> None:
    runner = CliRunner()
    path = str(outputs[".lmdb"])
    images = packer.FieldDataset(path, fields=("jpg",), output="bytes")
    image_bytes = sum(len(images[i][0]) for i in range(len(images)))
    for mode in ("bytes", "transform"):
        out = runner.invoke(main, ["bench", path, "--workers", "0", "--mode", mode, "--json"])
        assert out.exit_code == 0, out.output
        (run,) = json.loads(out.stdout)["runs"]
        assert run["images"] == 24 and run["bytes"] == image_bytes  # the image field's bytes
    out = runner.invoke(main, ["doctor", path, "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert report["samples"] == 24 and report["recommendations"]


def test_a_file_name_that_is_not_utf8_keeps_its_key(tmp_path: Path) -> None:
    written = make_caption_set(tmp_path / "src", samples=3)
    for field in ("txt", "jpg"):
        os.rename(
            tmp_path / "src" / f"000001.{field}",
            os.fsencode(tmp_path / "src") + b"/caf\xe9." + field.encode(),
        )
    result = packer.convert(tmp_path / "src", tmp_path / "o.lmdb", progress=False)
    assert not result.skipped
    ds = packer.FieldDataset(result.dst, output="bytes")
    by_key = {ds[i]["__key__"]: ds[i] for i in range(len(ds))}
    odd = os.fsdecode(b"caf\xe9")
    assert by_key[odd]["txt"] == written["000001"]["txt"]
    assert by_key[odd]["jpg"] == written["000001"]["jpg"]
    assert by_key["000001"]["cls"] == written["000001"]["cls"] and by_key["000001"]["txt"] is None


@pytest.mark.parametrize("suffix", [".lmdb", ".npy"])
def test_a_fused_crop_gets_the_stored_bytes_and_the_caption_stays_text(
    suffix: str, source: tuple[Path, dict[str, dict[str, bytes]]], outputs: dict[str, Path]
) -> None:
    """Issue 31's side-by-side found {"jpg": RandomResizedCrop(224)} failing on a decoded image
    unless output="bytes", which then made the caption bytes too."""
    crop = RandomResizedCrop(16, seed=0)
    ds = packer.open_dataset(outputs[suffix], fields=("jpg", "txt"), transform={"jpg": crop})
    loader = DataLoader(ds, batch_size=6, num_workers=2, collate_fn=packer.collate_fields)
    seen = 0
    for images, captions in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 16)
        assert all(isinstance(c, str) for c in captions)
        seen += len(captions)
    assert seen == len(ds)
    image, caption = ds[0]  # this process's first draw of the crop's own generator
    key = ds.keys[0]
    assert caption == source[1][key]["txt"].decode()
    assert torch.equal(image, RandomResizedCrop(16, seed=0)(source[1][key]["jpg"]))
