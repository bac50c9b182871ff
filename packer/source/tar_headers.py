"""The members of a tar by their headers alone: one 512-byte ``pread`` per member.

WebDataset shards are plain ustar, GNU or pax tars whose members are small files; Python's
``tarfile`` spends ~50 µs of Python per member building a ``TarInfo`` and trusts every size a
header claims. :func:`list_tar` parses the headers itself: name and ustar prefix, size in octal
or base-256, type, checksum checked as ``tarfile`` checks it, pax (``x``/``g``) records and GNU
long names (``L``/``K``). Every size is checked against the file before anything is read (an
extended header is read only when it fits the file and ``MAX_EXTENDED``), so a crafted header
is a listed reason, never an ``OverflowError`` or a 1 TiB read.

How a listing ends (:class:`Listing`): at the end-of-archive marker (zero blocks); members
after zero blocks are read as GNU ``tar -i`` reads them (``cat a.tar b.tar`` lists both); a
non-zero block that is no header ends it with ``stopped`` saying where (the members before it
are whole); the file's end without the marker, or a member whose data runs past the file, ends
it with ``cut`` set: the last sample may lack its later fields. A GNU sparse member (type ``S``
or pax ``GNU.sparse.*``) and a member whose pax records are unusable carry their ``problem``.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

__all__ = ["MAX_EXTENDED", "Listing", "Member", "list_fd", "list_tar"]

BLOCK = 512
MAX_EXTENDED = 1 << 20  # a pax or GNU long-name header's data; real ones are a few hundred bytes
_ZERO = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # a regular file's data follows its header
_NO_DATA = {b"1": "link", b"2": "sym", b"3": "other", b"4": "other", b"5": "dir", b"6": "other"}
_PAX = (b"x", b"g", b"X")  # X: Solaris' pax header


class Member(NamedTuple):
    """One member: its name, ``kind`` (``file``, ``dir``, ``link``, ``sym``, ``other``), the
    offset of its data in the tar, its size, and why it cannot be read by range (``""``: it can)."""

    name: str
    kind: str
    offset: int
    size: int
    problem: str = ""


class Listing(NamedTuple):
    """A tar's members, why the listing ended early (None: at the end-of-archive marker) and
    whether that end cut the last member's sample (a truncated tar)."""

    members: list[Member]
    stopped: str | None
    cut: bool


class _Bad(Exception):
    """A header that is not one; its message says why."""


def _number(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # base-256 (GNU): 0x80 positive, 0xff negative
        value = int.from_bytes(field[1:], "big")
        return value if field[0] == 0x80 else -1
    text = field.split(b"\0", 1)[0].strip()
    try:
        return int(text or b"0", 8)
    except ValueError:
        raise _Bad("not a header (a number field is not octal)") from None


def _parse(block: bytes) -> tuple[str, bytes, int]:
    """``(name, type flag, size)`` of a header block."""
    stored = _number(block[148:156])
    if stored != sum(block) - sum(block[148:156]) + 256:  # bytes unsigned, as writers sum them
        signed = sum(struct.unpack("148b", block[:148])) + sum(struct.unpack("356b", block[156:]))
        if stored != signed + 256:  # some old writers summed signed bytes: tarfile takes both
            raise _Bad("not a header (bad header checksum)")
    name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape"), block[156:157], _number(block[124:136])


def _pax(data: bytes) -> dict[str, str]:
    """The records of a pax header (``LEN key=value\\n`` each); _Bad when one is malformed."""
    out, pos = {}, 0
    while pos < len(data) and data[pos:].strip(b"\0"):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            raise _Bad("a pax record has no length")
        end = pos + int(data[pos:space])
        if end <= space or end > len(data) or data[end - 1 : end] != b"\n":
            raise _Bad("a pax record's length is wrong")
        key, eq, value = data[space + 1 : end - 1].partition(b"=")
        if not eq:
            raise _Bad("a pax record has no '='")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return out


class _Walk:
    """The state of one listing: the descriptor, the file's size, the next header's offset and
    what extended headers say of the next member."""

    def __init__(self, fd: int, total: int) -> None:
        self.fd, self.total, self.offset = fd, total, 0
        self.out: list[Member] = []
        self.glob: dict[str, str] = {}
        self.pax: dict[str, str] = {}
        self.long_name: str | None = None
        self.problem = ""

    def data(self, size: int, what: str) -> bytes:
        """The data of the extended header at ``offset``, checked before it is read."""
        if size > MAX_EXTENDED:
            raise _Bad(f"{what} header claims {size:,} bytes (over {MAX_EXTENDED:,})")
        if self.offset + BLOCK + size > self.total:
            raise _Bad(f"{what} header runs past the end of the file")
        return os.pread(self.fd, size, self.offset + BLOCK)

    def extended(self, flag: bytes, size: int) -> None:
        """Take in a pax or GNU long-name header (its records apply to the next member)."""
        if flag in _PAX:
            try:
                records = _pax(self.data(size, "pax"))
            except _Bad as exc:
                if "claims" in str(exc) or "past the end" in str(exc):
                    raise
                self.problem, records = f"unusable pax header: {exc}", {}
            (self.glob if flag == b"g" else self.pax).update(records)
        elif flag == b"L":
            self.long_name = (
                self.data(size, "GNU long-name")
                .split(b"\0", 1)[0]
                .decode("utf-8", "surrogateescape")
            )
        else:  # K: a long link name, of no use here
            self.data(size, "GNU long-link")

    def sparse_blocks(self, block: bytes) -> int:
        """The extension blocks an old GNU sparse header (``S``) has after it."""
        count, extended = 0, block[482]
        while extended:
            count += 1
            nxt = os.pread(self.fd, BLOCK, self.offset + count * BLOCK)
            if len(nxt) < BLOCK:
                raise _Bad("GNU sparse header runs past the end of the file")
            extended = nxt[504]
        return count

    def member(self, block: bytes) -> int:
        """Take in the header at ``offset``; the offset of the next header."""
        name, flag, size = _parse(block)
        if flag in _PAX or flag in (b"L", b"K"):
            if size < 0:
                raise _Bad("an extended header has a negative size")
            self.extended(flag, size)
            return self.offset + BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
        records = {**self.glob, **self.pax}
        name = records.get("path", self.long_name if self.long_name is not None else name)
        problem, self.problem, self.pax, self.long_name = self.problem, "", {}, None
        if "size" in records:
            if records["size"].isascii() and records["size"].isdigit():  # not "²", not "-5"
                size = int(records["size"])
            else:
                problem = problem or f"pax size {records['size']!r} is not a size"
        if size < 0:
            raise _Bad(f"member {name!r} has a negative size")
        skip = 0
        if flag == b"S" or any(k.startswith("GNU.sparse.") for k in records):
            problem = problem or "GNU sparse member: its bytes are not stored in order"
            skip = self.sparse_blocks(block) if flag == b"S" else 0
            kind = "file"
        elif flag in _REGULAR:
            kind = "dir" if flag == b"\0" and name.endswith("/") else "file"
        elif flag in _NO_DATA:
            kind, size = _NO_DATA[flag], 0
        else:
            kind, problem = "other", problem or f"member type {flag!r} is not a file"
        name = name.rstrip("/") if kind == "dir" else name
        start = self.offset + BLOCK * (1 + skip)
        self.out.append(Member(name, kind, start, size, problem))
        return start + (size + BLOCK - 1) // BLOCK * BLOCK


def _zeros_end(walk: _Walk) -> int:
    """The offset of the first non-zero block at or after ``walk.offset`` (the file's size when
    only zeros follow), read 64 KiB at a time."""
    offset = walk.offset
    while offset < walk.total:
        chunk = os.pread(walk.fd, 128 * BLOCK, offset)
        stripped = chunk.lstrip(b"\0")
        if stripped:
            return offset + (len(chunk) - len(stripped)) // BLOCK * BLOCK
        offset += len(chunk)
    return walk.total


def _walk(walk: _Walk) -> Listing:
    marker = False  # whether zero blocks came last
    while True:
        if walk.offset >= walk.total:
            if marker or not walk.out:
                return Listing(walk.out, None if walk.out else "empty file", False)
            return Listing(walk.out, "truncated archive (no end-of-archive marker)", True)
        block = os.pread(walk.fd, BLOCK, walk.offset)
        if len(block) < BLOCK:
            return Listing(
                walk.out, f"truncated archive (a partial block at byte {walk.offset:,})", True
            )
        if block == _ZERO:
            marker, walk.offset = True, _zeros_end(walk)
            continue
        try:
            nxt = walk.member(block)
        except _Bad as exc:
            lost = walk.total - walk.offset
            why = f"{exc} at byte {walk.offset:,}: the last {lost:,} bytes are not read"
            return Listing(walk.out, why if walk.out or marker else str(exc), False)
        if nxt > walk.total:  # the data of the member just listed runs past the file
            return Listing(walk.out, "truncated archive (a member runs past the end)", True)
        marker, walk.offset = False, nxt


def list_tar(path: str) -> Listing:
    """The :class:`Listing` of tar ``path``.

    Raises:
        OSError: the file cannot be opened or read.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return list_fd(fd)
    finally:
        os.close(fd)


def list_fd(fd: int) -> Listing:
    """The :class:`Listing` of the tar open as ``fd`` (the caller closes it).

    Raises:
        OSError: the file cannot be read.
    """
    return _walk(_Walk(fd, os.fstat(fd).st_size))
