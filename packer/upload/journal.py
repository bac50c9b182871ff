"""The journal of an upload (:mod:`packer.upload.uploader`): one JSON line per object uploaded, in the
staging folder, so that ``--resume`` does not send an object again that the store already holds.

A line is flushed as soon as its object is uploaded (a process kill keeps it); a lost or torn
line costs one upload again, never a wrong object: an entry counts only while the store's object
(size and ETag) is as it recorded and the bytes it was sent from are the ones the output needs
(the local file's size and mtime unchanged, or, once known, the xxh3 of the bytes sent equal to
the one the manifest records). A staged copy released after its upload
(:mod:`packer.upload.stream`) is marked so durably (the line fsync'd) before the file is touched,
so a kill at any point of the release leaves a copy that is known as released. Several
processes (``--part`` tasks sharing a staging folder) may append to one journal: each line is
one ``write`` under an exclusive ``flock`` of the file.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from pathlib import Path
from typing import Any

from packer.core.manifest import file_checksum

__all__ = ["JOURNAL_NAME", "Journal"]

JOURNAL_NAME = "upload-journal.jsonl"


class Journal:
    """The append-only record of finished uploads: one JSON line per object."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        self.sending: set[str] = set()  # objects whose upload was begun (maybe not finished)
        self.old: set[str] = set()  # objects of the dataset this upload replaces (deletable)
        self.kept: set[str] = set()  # other objects found beside it (never deleted)
        self.owned = False  # the journal exists: this staging folder writes that URL
        self._lock = threading.Lock()
        self._read()

    def _read(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
                self.owned = self.owned or "owner" in entry
                if "name" in entry:
                    self.entries[str(entry["name"])] = entry
                if "sending" in entry:
                    self.sending.add(str(entry["sending"]))
                if "old" in entry:
                    self.old.update(map(str, entry["old"]))
                    self.kept.update(map(str, entry["kept"]))
            except (ValueError, TypeError, AttributeError):
                continue  # a line torn by a crash: that object is uploaded again

    def intend(self, name: str) -> None:
        """Note, before its upload begins, that the object ``name`` will be this staging
        folder's (a kill during the upload leaves an object the journal knows)."""
        with self._lock:
            if name not in self.sending:
                self.sending.add(name)
                self._append({"sending": name})

    def adopt(self, old: set[str], kept: set[str]) -> None:
        """Note, durably, the objects found at the destination when this upload began over a
        dataset: ``old``, what its manifests list (deleted once the new one no longer has
        them), and ``kept``, anything else (a user's files, never deleted)."""
        with self._lock:
            self.old |= old
            self.kept |= kept
            self._append({"old": sorted(old), "kept": sorted(kept)}, durable=True)

    def known(self, names: list[str]) -> set[str]:
        """Which of ``names`` this journal (re-read: other ``--part`` processes append to it)
        says were sent or begun from this staging folder, or found beside the dataset this
        upload replaces."""
        with self._lock:
            self._read()
            mine = self.entries.keys() | self.sending | self.old | self.kept
            return {n for n in names if n in mine}

    def deletable(self, names: set[str]) -> set[str]:
        """Which of ``names`` packer wrote: sent from here or listed by the replaced dataset's
        manifests (never an object that was ``kept``)."""
        with self._lock:
            mine = (self.entries.keys() | self.sending | self.old) - self.kept
            return {n for n in names if n in mine}

    def _append(self, entry: dict[str, Any], durable: bool = False) -> None:
        """One line, written whole under the file's lock (other processes may append too);
        ``durable``: on disk before this returns (fsync)."""
        line = (json.dumps(entry) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock

    def claim(self, url: str) -> None:
        """Say that the objects at ``url`` are this staging folder's (appended: the entries of
        other processes stay), unless it is already said."""
        with self._lock:
            if not self.owned:
                self._append({"owner": url})
                self.owned = True

    def owned_now(self) -> bool:
        """Whether the journal says so now, another process's lines included."""
        if not self.owned:
            try:
                text = self.path.read_text(encoding="utf-8")
            except FileNotFoundError:
                return False
            self.owned = '"owner"' in text
        return self.owned

    def reset(self, url: str) -> None:
        """Start over: forget every upload (nothing is skipped as sent), but keep saying that
        the objects at ``url`` are this staging folder's: what it sent or found to replace
        stays deletable, what it found beside them stays kept."""
        with self._lock:
            old = (self.entries.keys() | self.sending | self.old) - self.kept
            lines = [{"owner": url}, {"old": sorted(old), "kept": sorted(self.kept)}]
            text = "".join(json.dumps(line) + "\n" for line in lines)
            temp = self.path.with_name(self.path.name + ".new")
            temp.write_text(text, encoding="utf-8")
            os.replace(temp, self.path)
            self.entries, self.sending, self.owned, self.old = {}, set(), True, old

    def record(
        self, name: str, local: os.stat_result, size: int, etag: str | None, xxh3: str
    ) -> None:
        """Note that ``name`` (the local file of ``local``, whose bytes hash to ``xxh3``) is at
        the store with ``size`` and ``etag``; flushed at once (a process kill keeps it)."""
        entry = {"name": name, "local": [local.st_size, local.st_mtime_ns], "size": size}
        entry.update(etag=etag, xxh3=xxh3)
        with self._lock:
            self.entries[name], self.owned = entry, True
            self._append(entry)

    def release(self, name: str) -> None:
        """Note, before the staged copy of the uploaded ``name`` is released (its blocks freed,
        its size and mtime kept: :mod:`packer.upload.stream`), that it cannot be sent again;
        on disk (fsync'd) before this returns, so a kill inside the release leaves it known."""
        with self._lock:
            entry = dict(self.entries[name], released=True)
            self.entries[name] = entry
            self._append(entry, durable=True)

    def sent_from(self, name: str) -> str | None:
        """The xxh3 of the bytes ``name`` was last uploaded from (None: not recorded)."""
        found = self.entries.get(name, {}).get("xxh3")
        return found if isinstance(found, str) else None

    def released(self, name: str, local: Path, expected: str | None = None) -> bool:
        """Whether ``local`` is (or was being made) the released staged copy of ``name``: the
        journal marks it released and its bytes are not whole any more, at whatever point of
        the release a kill came (emptied, zero-filled, its mtime not yet restored). A file
        written again since, whose bytes hash to ``expected`` (the manifest's xxh3) or to the
        xxh3 it was sent from, is not."""
        entry = self.entries.get(name, {})
        if not entry.get("released"):
            return False
        try:
            st = local.stat()
        except FileNotFoundError:
            return False
        if entry.get("local") == [st.st_size, st.st_mtime_ns] and st.st_blocks == 0:
            return True  # released to the end: a file of holes as recorded
        whole = expected or self.sent_from(name)
        return whole is None or file_checksum(local) != whole

    def holds(
        self,
        name: str,
        local: Path,
        remote: tuple[int, str | None] | None,
        expected: str | None = None,
    ) -> bool:
        """Whether the store still has the object ``name`` as uploaded (same size and ETag) and
        it was sent from the bytes the output needs: ``local`` as it is now (size and mtime),
        or a copy released since; and, where the journal and the manifest both know it, with
        the xxh3 ``expected``."""
        entry = self.entries.get(name)
        if entry is None or remote is None:
            return False
        if (entry.get("size"), entry.get("etag")) != remote:
            return False
        sent = self.sent_from(name)
        if expected is not None and sent is not None and sent != expected:
            return False  # sent from other bytes than the manifest's
        if entry.get("released"):
            return True  # its bytes are at the store only (or a copy identical to them)
        try:
            st = local.stat()
        except FileNotFoundError:
            return False
        return entry.get("local") == [st.st_size, st.st_mtime_ns]
