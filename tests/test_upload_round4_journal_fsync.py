"""Issue 40, the surviving mutant of ``upload/journal.py`` (the fsync of the journal's "released"
line): a streamed upload run under strace, each thread's system calls traced on their own
(``-ff``), shows for every staged copy released that its journal line was written and the
journal fsync'd before the file of holes was renamed over it. A kill cannot tell an fsync from
none (the page cache outlives the process); a power cut can, and this order is what survives
one. Against a real S3 server (moto on the loopback)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from s3_server import S3Server
from test_remote_write import objects

from packer.demo.image import make_image_tree

BUCKET = "round4-fsync"

_WRITE = re.compile(r'^write\(\d+<(?P<path>[^>]*)>, "(?P<text>.*)", \d+\) += \d+$')
_SYNC = re.compile(r"^f(?:data)?sync\(\d+<(?P<path>[^>]*)>\) += 0$")
_RENAME = re.compile(
    r'^rename(?:at2?)?\((?:AT_FDCWD, )?"(?P<old>[^"]*)", (?:AT_FDCWD, )?"(?P<new>[^"]*)"'
)
_NAME = re.compile(r'\\"name\\": \\"(?P<name>[^\\]*)\\"')

SCRIPT = """
import sys
from packer.upload.staging import convert_to_url
convert_to_url(sys.argv[1], sys.argv[2], storage_options={"endpoint_url": sys.argv[3]},
               staging=sys.argv[4], shard_size="4kB", workers=1, staging_limit=1,
               progress=False)
"""


def released_in_order(trace: str) -> tuple[int, list[str]]:
    """In one thread's trace: the releases seen, and those whose "released" journal line was
    not written, or the journal not fsync'd after it, before the rename over the staged copy."""
    lines = trace.splitlines()
    written: dict[str, int] = {}  # shard name -> index of its "released" line's write
    synced: list[int] = []  # indexes of the journal's fsyncs
    releases, problems = 0, []
    for i, line in enumerate(lines):
        if (m := _WRITE.match(line)) and m["path"].endswith("upload-journal.jsonl"):
            if '\\"released\\": true' in m["text"] and (name := _NAME.search(m["text"])):
                written[name["name"].rsplit("/", 1)[-1]] = i
        elif (m := _SYNC.match(line)) and m["path"].endswith("upload-journal.jsonl"):
            synced.append(i)
        elif (m := _RENAME.match(line)) and "/.release-" in m["old"]:
            releases += 1
            name = m["new"].rsplit("/", 1)[-1]
            line_at = written.pop(name, None)
            if line_at is None:
                problems.append(f"{name}: released with no journal line written before")
            elif not any(line_at < s < i for s in synced):
                problems.append(f"{name}: its journal line was not fsync'd before the release")
    return releases, problems


def test_every_release_is_journaled_and_fsynced_first(server: S3Server, tmp_path: Path) -> None:
    strace = shutil.which("strace")
    if strace is None:
        pytest.fail("strace is needed to observe fsync: install it (make tools)")
    src = make_image_tree(tmp_path / "images", classes=2, per_class=6, size=(64, 48), bad=0).root
    url, staging, prefix = f"s3://{BUCKET}/fsynced.npy", tmp_path / "staging", tmp_path / "trace"
    command = [strace, "-ff", "-qq", "-y", "-s", "4096", "-o", str(prefix)]
    command += ["-e", "trace=write,fsync,fdatasync,rename,renameat,renameat2"]
    command += [sys.executable, "-c", SCRIPT, str(src), url, server.endpoint, str(staging)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "packer.json" in objects(server, url)
    releases, problems = 0, []
    for trace in sorted(tmp_path.glob("trace.*")):
        found, wrong = released_in_order(trace.read_text(errors="replace"))
        releases, problems = releases + found, problems + wrong
    assert releases >= 4, "the shards were streamed and released"
    assert problems == []
