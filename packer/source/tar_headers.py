"""The members of a tar by their headers alone: one 512-byte ``pread`` per member.

WebDataset shards are plain ustar or GNU tars whose members are small files; Python's
``tarfile`` spends ~50 µs of Python per member building a ``TarInfo``, which on 20,000 members
is most of a conversion's scan. :func:`read_members` parses the fixed header fields itself (name
and ustar prefix, size in octal or base-256, type, checksum checked as ``tarfile`` checks it)
and hands a tar with any extended header (pax ``x``/``g``, GNU long names ``L``/``K``, sparse
``S``, ...) to ``tarfile`` whole, so names are never cut short.
"""

from __future__ import annotations

import os
import struct
import tarfile
from typing import NamedTuple

__all__ = ["Member", "read_members"]

BLOCK = 512
_ZERO = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")  # a regular file's data follows its header
_NO_DATA = {b"1": "link", b"2": "sym", b"3": "other", b"4": "other", b"5": "dir", b"6": "other"}


class Member(NamedTuple):
    """One member: its name, ``kind`` (``file``, ``dir``, ``link``, ``sym``, ``other``), the
    offset of its data in the tar and its size."""

    name: str
    kind: str
    offset: int
    size: int


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # base-256 (GNU), for sizes over 8 GiB
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text or b"0", 8)


def _parse(block: bytes) -> tuple[str, bytes, int] | None:
    """``(name, type flag, size)`` of a header block, or None when its checksum is wrong."""
    try:
        stored = _octal(block[148:156])
        size = _octal(block[124:136])
    except ValueError:
        return None
    if stored != sum(block) - sum(block[148:156]) + 256:  # bytes unsigned, as writers sum them
        signed = sum(struct.unpack("148b", block[:148])) + sum(struct.unpack("356b", block[156:]))
        if stored != signed + 256:  # some old writers summed signed bytes: tarfile takes both
            return None
    name = block[:100].split(b"\0", 1)[0]
    if block[257:263] == b"ustar\0":
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape"), block[156:157], size


def _with_tarfile(path: str) -> tuple[list[Member], str | None]:
    out: list[Member] = []
    try:
        with tarfile.open(path, "r:") as tar:
            for m in tar:
                kind = (
                    "file"
                    if m.isfile()
                    else "dir"
                    if m.isdir()
                    else "link"
                    if m.islnk()
                    else ("sym" if m.issym() else "other")
                )
                out.append(Member(m.name, kind, m.offset_data, m.size))
    except tarfile.ReadError as exc:
        return out, str(exc) or "not a tar"
    return out, None


def read_members(path: str) -> tuple[list[Member], str | None]:
    """The members of tar ``path`` in order, and why the listing ended early (a truncated or
    unreadable tar), None when it ended at the end of the archive.

    Raises:
        OSError: the file cannot be opened or read.
    """
    out: list[Member] = []
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        offset = 0
        while True:
            block = os.pread(fd, BLOCK, offset)
            if not block:
                return out, None if out else "empty file"
            if len(block) < BLOCK:
                return out, "unexpected end of data"
            if block == _ZERO:
                return out, None
            parsed = _parse(block)
            if parsed is None:
                return out, "bad checksum" if out else "not a tar (bad header checksum)"
            name, flag, size = parsed
            if flag in _REGULAR:
                kind = "dir" if flag == b"\0" and name.endswith("/") else "file"
            elif flag in _NO_DATA:
                kind, size = _NO_DATA[flag], 0
            else:  # an extended header changes the members after it: tarfile reads them
                return _with_tarfile(path)
            name = name.rstrip("/") if kind == "dir" else name
            out.append(Member(name, kind, offset + BLOCK, size))
            offset += BLOCK + (size + BLOCK - 1) // BLOCK * BLOCK
    finally:
        os.close(fd)
