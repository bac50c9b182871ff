"""WebDataset tar shards as a source (issue 30): brace patterns, folders and single tars convert
to LMDB, NPY and HDF5 and read back field for field equal to the samples the shards hold;
hostile members (absolute, ``..``, links, truncated tars, duplicate keys across shards) are
skipped with their reason, compressed tars refused in one line."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from s3_server import S3Server
from torch.utils.data import DataLoader

import packer
from packer.cli import main
from packer.demo.fields import make_caption_set, write_shards
from packer.source.tars import expand_braces

Samples = dict[str, dict[str, bytes]]
BUCKET = "tars"


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Samples]:
    root = tmp_path_factory.mktemp("tars")
    written = make_caption_set(root / "files", samples=20)
    write_shards(written, root / "shards", per_shard=6)  # 4 shards: 6, 6, 6, 2
    return root / "shards", written


def _add(tar: tarfile.TarFile, name: str, data: bytes = b"x", **kind: object) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data) if not kind else 0
    for key, value in kind.items():
        setattr(info, key, value)
    tar.addfile(info, io.BytesIO(data) if not kind else None)


def test_expand_braces_as_webdataset_writes_them() -> None:
    assert expand_braces("s/{000..002}.tar") == ["s/000.tar", "s/001.tar", "s/002.tar"]
    assert expand_braces("{a,b}-{8..10}.tar") == [
        *("a-8.tar", "a-9.tar", "a-10.tar", "b-8.tar", "b-9.tar", "b-10.tar")
    ]
    with pytest.raises(packer.SourceError, match="empty"):
        expand_braces("{5..1}.tar")


@pytest.mark.parametrize("suffix", [".lmdb", ".npy", ".h5"])
def test_brace_pattern_reads_back_field_for_field_through_workers(
    suffix: str, shards: tuple[Path, Samples], tmp_path: Path
) -> None:
    folder, written = shards
    pattern = str(folder / "{000000..000003}.tar")
    result = packer.convert(pattern, tmp_path / f"out{suffix}", progress=False)
    assert result.manifest.num_samples == len(written) and not result.skipped
    loader = DataLoader(
        packer.FieldDataset(result.dst, output="bytes"),
        batch_size=4,
        num_workers=2,
        collate_fn=packer.collate_fields,
        multiprocessing_context="fork",
    )
    got = {}
    for batch in loader:
        for i, key in enumerate(batch["__key__"]):
            got[key] = {f: batch[f][i] for f in batch if f != "__key__" and batch[f][i] is not None}
    assert got == written  # every field's bytes, and the absent json absent


def test_folder_of_tars_and_one_tar_are_sources_too(
    shards: tuple[Path, Samples], tmp_path: Path
) -> None:
    folder, written = shards
    whole = packer.convert(folder, tmp_path / "a.npy", progress=False)
    assert "tar shards" in whole.summary() and whole.manifest.num_samples == len(written)
    one = packer.convert(folder / "000003.tar", tmp_path / "b.npy", progress=False)
    assert list(packer.FieldDataset(one.dst).keys) == ["000018", "000019"]


def test_same_bytes_for_any_worker_count(shards: tuple[Path, Samples], tmp_path: Path) -> None:
    folder = shards[0]
    outs = [
        packer.convert(
            folder, tmp_path / f"w{n}.lmdb", workers=n, shard_size="40KB", progress=False
        )
        for n in (1, 3)
    ]
    files = [sorted(p.name for p in out.dst.iterdir()) for out in outs]
    assert files[0] == files[1] and len([f for f in files[0] if f.endswith(".mdb")]) > 1
    for name in files[0]:
        if name.endswith(".mdb") or name.endswith(".npy"):
            assert (outs[0].dst / name).read_bytes() == (outs[1].dst / name).read_bytes()


def test_hostile_members_skipped_with_their_reason(tmp_path: Path) -> None:
    shard = tmp_path / "bad.tar"
    with tarfile.open(shard, "w") as tar:
        _add(tar, "0001.txt", b"kept")
        _add(tar, "/etc/0002.txt")
        _add(tar, "../0003.txt")
        _add(tar, "0004.txt", type=tarfile.SYMTYPE, linkname="/etc/passwd")
        _add(tar, "0005.txt", type=tarfile.LNKTYPE, linkname="0001.txt")
        _add(tar, "0006.t xt")
        _add(tar, "0007.fifo", type=tarfile.FIFOTYPE)
    result = packer.convert(shard, tmp_path / "o.lmdb", progress=False)
    reasons = {s.path.rsplit(":", 1)[1]: s.reason for s in result.skipped}  # a sample each
    assert reasons["/etc/0002.*"] == "field 'txt' (/etc/0002.txt): absolute member name"
    assert "outside" in reasons["../0003.*"]
    assert "linked" in reasons["0004.*"] and "linked" in reasons["0005.*"]
    assert "not a plain" in reasons["0006.*"]
    assert reasons["0007.*"] == "field 'fifo' (0007.fifo): not a regular file"
    assert packer.FieldDataset(result.dst)[0] == {"__key__": "0001", "txt": "kept"}


def test_truncated_tar_loses_only_the_cut_sample_and_says_so(
    shards: tuple[Path, Samples], tmp_path: Path
) -> None:
    whole = (shards[0] / "000000.tar").read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[: len(whole) // 2])
    result = packer.convert(cut, tmp_path / "o.npy", progress=False)
    truncated = [s for s in result.skipped if "truncated" in s.reason]
    assert len(truncated) == 1 and truncated[0].path == str(cut)
    ds = packer.FieldDataset(result.dst, output="bytes")
    assert 0 < len(ds) < 6
    with tarfile.open(shards[0] / "000000.tar") as tar:
        last = tar.getmembers()[-1]  # 000005.txt: a cut in its bytes, no header after it
    cut.write_bytes(whole[: last.offset_data + last.size - 1])
    again = packer.convert(cut, tmp_path / "o2.npy", progress=False)
    assert list(packer.FieldDataset(again.dst).keys) == [f"{i:06d}" for i in range(5)]
    assert [s.reason for s in again.skipped] == [
        "truncated archive (a member runs past the end): sample '000005' (it may lack later "
        "fields) and anything after it lost"
    ]
    for i in range(len(ds)):  # every kept sample whole, none with a field missing
        sample = ds[i]
        want = shards[1][sample["__key__"]]
        assert {k: v for k, v in sample.items() if k in want} == want


def test_duplicate_keys_across_shards_and_case_keys_skipped(tmp_path: Path) -> None:
    for name, keys in (("a.tar", ["k1", "Case"]), ("b.tar", ["k1", "case", "k2"])):
        with tarfile.open(tmp_path / name, "w") as tar:
            for key in keys:
                _add(tar, f"{key}.txt", key.encode())
    (tmp_path / "out").mkdir()
    result = packer.convert(str(tmp_path / "{a,b}.tar"), tmp_path / "out/o.lmdb", progress=False)
    assert list(packer.FieldDataset(result.dst).keys) == ["k2"]
    reasons = sorted(s.reason.split(" as ")[0] for s in result.skipped)
    assert reasons == ["a key that differs only by case"] * 2 + ["the same key"] * 2


def test_bad_shard_sources_refused_in_one_line(
    shards: tuple[Path, Samples], tmp_path: Path
) -> None:
    folder = shards[0]
    runner = CliRunner()
    cases = [
        (str(folder / "{000000..000009}.tar"), "000004.tar' does not exist"),
        (str(tmp_path / "x.tar.gz"), "compressed tar"),
    ]
    (tmp_path / "x.tar.gz").write_bytes(b"\x1f\x8b")
    for src, message in cases:
        got = runner.invoke(main, ["convert", src, str(tmp_path / "o.lmdb"), "-q"])
        assert got.exit_code != 0 and message in got.output, got.output
        assert "Traceback" not in got.output
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 64)
    got = runner.invoke(main, ["convert", str(junk), str(tmp_path / "p.lmdb"), "-q"])
    assert got.exit_code != 0 and "holds no sample" in got.output


def test_cli_converts_a_pattern_with_require(shards: tuple[Path, Samples], tmp_path: Path) -> None:
    pattern = str(shards[0] / "{000000..000003}.tar")
    dst = tmp_path / "o.h5"
    got = CliRunner().invoke(main, ["convert", pattern, str(dst), "--require", "json", "-q"])
    assert got.exit_code == 0, got.output
    ds = packer.open_dataset(dst, fields=("json",))
    assert len(ds) == 10 and all(ds[i][0]["id"] == 2 * i for i in range(10))


def test_tars_at_a_url_fetched_once_then_converted(
    shards: tuple[Path, Samples], server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    url = server.upload(shards[0], "shards")
    pattern = url + "/{000000..000003}.tar"
    dst = tmp_path / "o.lmdb"
    option = f"endpoint_url={server.endpoint}"
    got = CliRunner().invoke(main, ["convert", pattern, str(dst), "--storage-option", option])
    assert got.exit_code == 0, got.output
    assert "tar shards" in got.output
    local = packer.open_dataset(
        packer.convert(shards[0], tmp_path / "l.lmdb", progress=False).dst, output="bytes"
    )
    remote = packer.open_dataset(dst, output="bytes")
    assert [remote[i] for i in range(len(remote))] == [local[i] for i in range(len(local))]
    fetched = sorted((tmp_path / "cache" / "sources").glob("*/*.tar"))
    assert [p.name for p in fetched] == [f"{i:06d}-{i:06d}.tar" for i in range(4)]
    stamps = [p.stat().st_mtime_ns for p in fetched]
    again = packer.convert(
        pattern, tmp_path / "p.npy", source_options=server.options, progress=False
    )
    assert again.manifest.num_samples == len(shards[1])
    assert [p.stat().st_mtime_ns for p in fetched] == stamps  # not fetched a second time
    # the source object replaced by one of the same size: fetched anew, its caption read
    with tarfile.open(shards[0] / "000003.tar") as tar:
        txt = next(m for m in tar.getmembers() if m.name.endswith(".txt"))
    data = bytearray((shards[0] / "000003.tar").read_bytes())
    data[txt.offset_data : txt.offset_data + txt.size] = b"NEW!".ljust(txt.size, b".")
    with server.filesystem().open(f"{url}/000003.tar", "wb") as handle:
        handle.write(bytes(data))
    fresh = packer.convert(
        pattern, tmp_path / "r.npy", source_options=server.options, progress=False
    )
    key = txt.name.split(".")[0]
    assert not fresh.skipped, fresh.skipped
    got = packer.FieldDataset(fresh.dst, fields=("txt",))
    assert got[list(got.keys).index(key)][0].startswith("NEW!")
    # a fetched copy damaged here (same size): fetched again, never converted as it is
    damaged = bytearray(fetched[0].read_bytes())
    damaged[600] ^= 0xFF
    fetched[0].write_bytes(bytes(damaged))
    again = packer.convert(
        pattern, tmp_path / "s.npy", source_options=server.options, progress=False
    )
    assert fetched[0].read_bytes() == (shards[0] / "000000.tar").read_bytes()
    assert again.manifest.num_samples == len(shards[1])
    missing = CliRunner().invoke(
        main, ["convert", url + "/{000000..000009}.tar", str(tmp_path / "q.lmdb"),
               "--storage-option", option],
    )  # fmt: skip
    assert missing.exit_code != 0 and "000004.tar' does not exist" in missing.output
    assert "Traceback" not in missing.output


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_and_non_ascii_member_names_keep_their_keys(fmt: int, tmp_path: Path) -> None:
    deep = "/".join(["folder"] * 14)  # 97 characters: ustar puts it in the prefix field
    keys = [f"{deep}/0001", "k" * 120 if fmt != tarfile.USTAR_FORMAT else "short", "café"]
    shard = tmp_path / "names.tar"
    with tarfile.open(shard, "w", format=fmt) as tar:
        for key in keys:
            _add(tar, f"{key}.txt", key.encode())
            _add(tar, f"{key}.cls", b"7")
    result = packer.convert(shard, tmp_path / "o.npy", progress=False)
    assert not result.skipped
    ds = packer.FieldDataset(result.dst)
    assert sorted(ds[i]["txt"] for i in range(len(ds))) == sorted(keys)
    assert sorted(ds.keys) == sorted(keys) and {ds[i]["cls"] for i in range(3)} == {7}


def test_a_damaged_header_ends_the_listing_with_its_reason(
    shards: tuple[Path, Samples], tmp_path: Path
) -> None:
    data = bytearray((shards[0] / "000000.tar").read_bytes())
    with tarfile.open(shards[0] / "000000.tar") as tar:
        third = tar.getmembers()[7]  # the first member of the third sample (000002.cls)
    header = third.offset_data - 512
    data[header + 10] ^= 0xFF  # a flipped byte in its name: the checksum no longer matches
    bad = tmp_path / "bad.tar"
    bad.write_bytes(bytes(data))
    result = packer.convert(bad, tmp_path / "o.lmdb", progress=False)
    # the samples before the damaged header are whole and kept; what it hides is listed
    assert list(packer.FieldDataset(result.dst).keys) == ["000000", "000001"]
    assert [s.reason for s in result.skipped] == [
        f"not a header (bad header checksum) at byte {header:,}: the last {len(data) - header:,} "
        "bytes are not read"
    ]
