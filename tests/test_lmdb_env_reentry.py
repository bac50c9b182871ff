"""A dropped reader's handles are closed by a GC finalizer, which may run at any allocation:
also while this thread holds the environments' lock to open another shard (seen as a hang of
the suite: Handle.close waiting for the lock inside _Env.__init__). The lock is re-entrant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import packer
from packer.demo.image import make_image_tree

ROOT = str(Path(__file__).resolve().parents[1])

SCRIPT = """
import sys
import packer
from packer.formats import lmdb_env

first = packer.open_dataset(sys.argv[1], output="bytes")
expected = first[0]  # its shard handle is open
handle = next(iter(first.reader.handles.values()))
with lmdb_env._OPEN_LOCK:  # as _Env.__init__ holds it when a finalizer runs
    handle.close()
second = packer.open_dataset(sys.argv[1], output="bytes")
assert second[0] == expected
print("ok")
"""


def test_a_handle_closed_while_the_lock_is_held_does_not_hang(tmp_path: Path) -> None:
    src = make_image_tree(tmp_path / "images", classes=2, per_class=2, size=(32, 24), bad=0).root
    dst = tmp_path / "o.lmdb"
    packer.convert(src, dst, progress=False)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(dst)],
        capture_output=True,
        text=True,
        timeout=120,  # a hang, not a speed: the re-entrant close takes milliseconds
        env={"PYTHONPATH": ROOT, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
