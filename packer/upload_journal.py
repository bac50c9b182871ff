"""The journal of an upload (:mod:`packer.upload`): one JSON line per object uploaded, in the
staging folder, so that ``--resume`` does not send an object again that the store already holds.

A line is flushed as soon as its object is uploaded (a process kill keeps it); a lost or torn
line costs one upload again, never a wrong object: an entry counts only while both the local
file (size and mtime) and the store's object (size and ETag) are as it recorded. Several
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

__all__ = ["JOURNAL_NAME", "Journal"]

JOURNAL_NAME = "upload-journal.jsonl"


class Journal:
    """The append-only record of finished uploads: one JSON line per object."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = {}
        self.owned = False  # the journal exists: this staging folder writes that URL
        self._lock = threading.Lock()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            lines = []
        for line in lines:
            try:
                entry = json.loads(line)
                self.owned = self.owned or "owner" in entry
                if "name" in entry:
                    self.entries[str(entry["name"])] = entry
            except (ValueError, TypeError):
                continue  # a line torn by a crash: that object is uploaded again

    def _append(self, entry: dict[str, Any]) -> None:
        """One line, written whole under the file's lock (other processes may append too)."""
        line = (json.dumps(entry) + "\n").encode("utf-8")
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, line)
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
        """Start over: forget every upload, but keep saying that the objects at ``url`` are
        this staging folder's (an interrupted upload of ours may be there)."""
        with self._lock:
            self.path.write_text(json.dumps({"owner": url}) + "\n", encoding="utf-8")
            self.entries, self.owned = {}, True

    def record(self, name: str, local: os.stat_result, size: int, etag: str | None) -> None:
        """Note that ``name`` (the local file of ``local``) is at the store with ``size`` and
        ``etag``; flushed at once (a process kill keeps it)."""
        entry = {"name": name, "local": [local.st_size, local.st_mtime_ns], "size": size}
        entry["etag"] = etag
        with self._lock:
            self.entries[name], self.owned = entry, True
            self._append(entry)

    def release(self, name: str) -> None:
        """Note, before the staged copy of the uploaded ``name`` is released (its blocks freed,
        its size and mtime kept: :mod:`packer.upload_stream`), that it cannot be sent again."""
        with self._lock:
            entry = dict(self.entries[name], released=True)
            self.entries[name] = entry
            self._append(entry)

    def released(self, name: str, local: Path) -> bool:
        """Whether ``local`` is the staged copy of ``name`` released after its upload (a file
        written since is not)."""
        entry = self.entries.get(name, {})
        if not entry.get("released"):
            return False
        try:
            st = local.stat()
        except FileNotFoundError:
            return False
        return entry.get("local") == [st.st_size, st.st_mtime_ns]

    def holds(self, name: str, local: Path, remote: tuple[int, str | None] | None) -> bool:
        """Whether ``name`` was uploaded from ``local`` as it is now and the store still has
        that object (same size and ETag)."""
        entry = self.entries.get(name)
        if entry is None or remote is None:
            return False
        try:
            st = local.stat()
        except FileNotFoundError:
            return False
        same_local = entry.get("local") == [st.st_size, st.st_mtime_ns]
        return same_local and (entry.get("size"), entry.get("etag")) == remote
