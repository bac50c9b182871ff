"""Crafted tar shards (issue 41, items 1 and 3): a header that lies about its size, a sparse
member, a cut at a member boundary, concatenated tars, a damaged header: each is that shard's or
that sample's skip with its reason; what precedes stays whole; nothing vanishes unlisted; the good
shard beside a bad one converts."""

from __future__ import annotations

import io
import tarfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import packer

BLOCK = 512


def _octal(value: int, width: int = 12) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def _header(name: str, size: int | bytes, flag: bytes = b"0", extra: bytes = b"") -> bytes:
    """A ustar header block, its checksum right (``size`` raw bytes: a crafted size field;
    ``extra``: bytes from offset 345, e.g. an old GNU sparse map)."""
    block = bytearray(BLOCK)
    block[0 : len(name)] = name.encode()
    block[100:108] = _octal(0o644, 8)
    block[108:116] = block[116:124] = _octal(0, 8)
    block[124:136] = size if isinstance(size, bytes) else _octal(size)
    block[136:148] = _octal(0)
    block[156:157] = flag
    block[257:265] = b"ustar\x0000"
    block[345 : 345 + len(extra)] = extra
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % BLOCK)


def _member(name: str, data: bytes = b"x", flag: bytes = b"0") -> bytes:
    return _header(name, len(data), flag) + _pad(data)


def _pax(records: dict[str, str]) -> bytes:
    body = b""
    for key, value in records.items():
        line = f" {key}={value}\n".encode()
        n = len(line) + len(str(len(line)))
        n = len(line) + len(str(n))
        body += str(n).encode() + line
    return _header("././@PaxHeader", len(body), b"x") + _pad(body)


END = bytes(2 * BLOCK)


def _sample(key: str) -> bytes:
    return _member(f"{key}.cls", b"1") + _member(f"{key}.txt", f"caption {key}".encode())


def _convert(tmp_path: Path, shards: dict[str, bytes]) -> tuple[list[str], dict[str, str]]:
    """Convert a folder of ``shards``: the keys stored and ``{path tail: reason}`` skipped."""
    folder = tmp_path / "shards"
    folder.mkdir()
    for name, data in shards.items():
        (folder / name).write_bytes(data)
    result = packer.convert(folder, tmp_path / "out.lmdb", progress=False)
    keys = list(packer.FieldDataset(result.dst).keys)
    return keys, {s.path.replace(str(folder) + "/", ""): s.reason for s in result.skipped}


GOOD = _sample("g1") + _sample("g2") + END


@pytest.mark.parametrize(
    ("crafted", "reason"),
    [
        (_header("b1.txt", b"\xff" * 12) + b"x" * BLOCK + END, "negative size"),
        (_header("b1.txt", b"\x80" + b"\x7f" * 11) + b"x" * BLOCK + END, "runs past the end"),
        (_header("././@LongLink", b"\x80" + (1 << 40).to_bytes(11, "big"), b"L") + END, "claims"),
        (_header("././@PaxHeader", b"\x80" + (1 << 40).to_bytes(11, "big"), b"x") + END, "claims"),
    ],
    ids=["base256-ff", "base256-huge", "gnu-longname-1TiB", "pax-1TiB"],
)
def test_a_lying_size_skips_its_shard_and_not_the_good_one(
    tmp_path: Path, crafted: bytes, reason: str
) -> None:
    keys, skipped = _convert(tmp_path, {"a.tar": GOOD, "b.tar": _sample("b0") + crafted})
    assert keys == ["g1", "g2", "b0"]
    assert reason in skipped["b.tar"], skipped


def test_a_garbage_pax_sparse_map_skips_its_sample(tmp_path: Path) -> None:
    sparse = _pax({"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.map": "zz,q"})
    tar = (
        _sample("s0") + sparse + _member("s1.txt", b"10\nzz\n") + _member("s1.cls") + _sample("s2")
    )
    keys, skipped = _convert(tmp_path, {"a.tar": GOOD, "b.tar": tar + END})
    assert keys == ["g1", "g2", "s0", "s2"]
    assert "sparse" in skipped["b.tar:s1.*"]


def test_an_old_gnu_sparse_member_is_skipped_not_stored_as_archive_bytes(tmp_path: Path) -> None:
    # map: 4 bytes of data at offset 0 of a 2048-byte file; the next entries, then isextended=0
    sparse_map = _octal(0) + _octal(4) + bytes(12 * 6) + b"\0" + _octal(2048)
    extra = bytes(386 - 345) + sparse_map
    tar = _sample("s0") + _header("s1.txt", 4, b"S", extra) + _pad(b"abcd") + _sample("s2") + END
    with tarfile.open(fileobj=io.BytesIO(tar)) as check:  # a tar GNU tools read
        assert check.getmember("s1.txt").issparse()
    keys, skipped = _convert(tmp_path, {"b.tar": tar})
    assert keys == ["s0", "s2"]
    assert "sparse" in skipped["b.tar:s1.*"]


@pytest.mark.parametrize("size", ["-5", "²", "0x10"])
def test_a_pax_size_that_is_no_size_skips_that_sample_only(tmp_path: Path, size: str) -> None:
    tar = _sample("s0") + _pax({"size": size}) + _member("s1.txt") + _sample("s2") + END
    keys, skipped = _convert(tmp_path, {"a.tar": GOOD, "b.tar": tar})
    assert keys == ["g1", "g2", "s0", "s2"]
    assert f"pax size {size!r}" in skipped["b.tar:s1.*"]


def test_a_tar_cut_at_a_member_boundary_is_listed_as_truncated(tmp_path: Path) -> None:
    keys, skipped = _convert(tmp_path, {"b.tar": _sample("s0") + _sample("s1")})  # no marker
    assert keys == ["s0"]  # s1 may have had later fields
    assert skipped["b.tar"].startswith("truncated archive (no end-of-archive marker)")
    assert "'s1'" in skipped["b.tar"]


def test_concatenated_tars_are_read_as_gnu_tar_i_reads_them(tmp_path: Path) -> None:
    keys, skipped = _convert(tmp_path, {"b.tar": _sample("s0") + END + _sample("s1") + END})
    assert keys == ["s0", "s1"] and skipped == {}


@pytest.mark.parametrize("marker", [b"", END], ids=["no-marker", "after-marker"])
def test_garbage_after_the_last_member_is_listed_and_what_precedes_kept(
    tmp_path: Path, marker: bytes
) -> None:
    tar = _sample("s0") + _sample("s1") + marker + b"garbage!" * 64 + END
    keys, skipped = _convert(tmp_path, {"b.tar": tar})
    assert keys == ["s0", "s1"]
    assert "not a header" in skipped["b.tar"] and "bytes are not read" in skipped["b.tar"]


def test_a_linked_member_skips_its_sample_whole(tmp_path: Path) -> None:
    tar = _sample("s0") + _member("s1.cls", b"1") + _header("s1.txt", 0, b"2") + _sample("s2")
    keys, skipped = _convert(tmp_path, {"b.tar": tar + END})
    assert keys == ["s0", "s2"]  # not s1 with its txt None
    assert "linked member" in skipped["b.tar:s1.*"]


def test_a_linked_tar_leaving_the_folder_of_shards_is_skipped_unless_followed(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "elsewhere" / "secret.tar"
    outside.parent.mkdir()
    outside.write_bytes(_sample("x0") + END)
    folder = tmp_path / "shards"
    folder.mkdir()
    (folder / "a.tar").write_bytes(GOOD)
    (folder / "b.tar").symlink_to(outside)
    result = packer.convert(folder, tmp_path / "out.lmdb", progress=False)
    assert list(packer.FieldDataset(result.dst).keys) == ["g1", "g2"]
    reasons = {s.path: s.reason for s in result.skipped}
    assert reasons[str(folder / "b.tar")].startswith("a link leading outside the source")
    assert "--follow-links" in " ".join(result.notes)
    followed = packer.convert(folder, tmp_path / "f.lmdb", progress=False, follow_links=True)
    assert list(packer.FieldDataset(followed.dst).keys) == ["g1", "g2", "x0"]


class _Shards(BaseHTTPRequestHandler):
    """Range requests over ``files`` (name -> bytes), one validator header as ``validator`` says."""

    files: dict[str, bytes] = {}
    validator = "ETag"
    version = 1

    def log_message(self, *args: object) -> None:
        pass

    def _head(self) -> bytes | None:
        data = self.files.get(self.path.lstrip("/"))
        if data is None:
            self.send_error(404)
            return None
        start, stop = 0, len(data)
        ranged = self.headers.get("Range", "")
        if ranged.startswith("bytes="):
            first, _, last = ranged[6:].partition("-")
            start, stop = int(first), min(len(data), int(last) + 1 if last else len(data))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(stop - start))
        self.send_header("Accept-Ranges", "bytes")
        if self.validator == "ETag":
            self.send_header("ETag", f'"v{self.version}"')
        elif self.validator == "Last-Modified":
            self.send_header("Last-Modified", f"Mon, 07 Dec 2026 0{self.version}:00:00 GMT")
        self.end_headers()
        return data[start:stop]

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._head()

    def do_GET(self) -> None:  # noqa: N802
        data = self._head()
        if data is not None:
            self.wfile.write(data)


@pytest.mark.parametrize("validator", ["ETag", "Last-Modified", "none"])
def test_an_http_shard_replaced_with_the_same_size_is_fetched_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, validator: str
) -> None:
    """W8: the fetch cache keeps an HTTP(S) shard's ETag or Last-Modified, else its bytes'
    digest, not its size alone; an unchanged shard's copy is kept (its time too: --resume)."""
    monkeypatch.setenv("PACKER_CACHE_DIR", str(tmp_path / "cache"))
    handler = type("Handler", (_Shards,), {"files": {}, "validator": validator})
    handler.files["a.tar"] = _member("s0.txt", b"old!") + END
    served = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=served.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{served.server_address[1]}/a.tar"
        first = packer.convert(url, tmp_path / "one.lmdb", progress=False)
        assert packer.FieldDataset(first.dst, output="bytes")[0]["txt"] == b"old!"
        (copy,) = (tmp_path / "cache").rglob("*-a.tar")
        kept = copy.stat().st_mtime_ns
        packer.convert(url, tmp_path / "same.lmdb", progress=False)
        assert copy.stat().st_mtime_ns == kept  # not fetched again
        handler.files["a.tar"] = _member("s0.txt", b"new!") + END  # the same size
        handler.version = 2
        again = packer.convert(url, tmp_path / "two.lmdb", progress=False)
        assert packer.FieldDataset(again.dst, output="bytes")[0]["txt"] == b"new!"
    finally:
        served.shutdown()
        served.server_close()
