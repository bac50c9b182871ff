"""Issue 40, item 6: after a read error the process did not exit until its background prefetch
downloads had finished their retries (error at 228 s, exit at 900 s: the prefetch pool was
joined at exit). Background downloads run on daemon threads and are cancelled at exit (the
work waiting dropped, a running one stopped at its next chunk), so the process ends with its
error. A real reader process against a real HTTP server: shard 0 denied, every other shard's
download stalled (read, never answered) with a 600 s read timeout.

The subprocess's ``timeout=`` is a hang guard only (the fixed path takes a few seconds; the bug
waits out the 600 s read timeouts)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from bounds_servers import FileServer, file_server

import packer
from packer.demo.image import make_image_tree
from packer.remote import downloads
from packer.remote.failures import MissingObject

READER = textwrap.dedent(
    """
    import sys
    import packer

    url, cache = sys.argv[1], sys.argv[2]
    options = {"backend": "fsspec", "read_timeout": 600, "connect_timeout": 5}
    ds = packer.open_dataset(url, output="bytes", cache_dir=cache, storage_options=options)
    shards = len(ds.reader.shard_names)
    print("PREFETCHING", ds.reader.prefetch(range(1, shards)), flush=True)
    try:
        ds[0]
    except packer.PackerError as exc:
        print("READ ERROR", type(exc).__name__, exc, flush=True)
        sys.exit(3)
    """
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FileServer]:
    root = tmp_path_factory.mktemp("bounds_exit")
    source = make_image_tree(root / "src", classes=2, per_class=6, size=(64, 48), bad=0).root
    (root / "www").mkdir()
    packer.convert(source, root / "www" / "images.npy", shard_size="8kB", workers=1, progress=False)
    with file_server(root / "www") as running:
        yield running


def test_a_reader_exits_with_its_error_while_prefetches_stall(
    served: FileServer, tmp_path: Path
) -> None:
    served.always(r"^GET /images\.npy/shard-00000\.npy", "403")
    served.always(r"^GET /images\.npy/shard-0*[1-9]\d*\.npy", "stall")
    script = tmp_path / "reader.py"
    script.write_text(READER)
    url = f"{served.endpoint}/images.npy"
    done = subprocess.run(
        [sys.executable, str(script), url, str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard: the bug waits out 600 s read timeouts
    )
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert "READ ERROR MissingObject" in done.stdout and "403" in done.stdout, done.stdout
    started = int(done.stdout.split("PREFETCHING", 1)[1].split()[0])
    assert started >= 5, done.stdout  # more than the 4 threads: some waited, some ran
    stalled = [s for s in served.seen if s.endswith("-> stall")]
    assert stalled, served.seen  # a download was in flight when the process ended


def test_cancelled_downloads_drop_their_waiting_work_and_stop_the_running() -> None:
    """Real prefetch threads: the work waiting is never run; the running work sees it is
    cancelled (a download checks at each chunk) and ends; later work runs again."""
    release, ran, saw = threading.Event(), [], []

    def running(k: int) -> None:
        ran.append(k)
        release.wait(60)
        saw.append(downloads.cancelled())

    threads = downloads.PREFETCH_THREADS
    for k in range(threads + 3):
        assert downloads.in_background(f"test-cancel-{k}", lambda k=k: running(k))
    while len(ran) < threads:  # the threads took their work (an event each, no clock)
        release.wait(0.01)
    assert downloads.cancel_downloads() == 3
    release.set()
    assert downloads.wait_for_downloads(60)
    assert sorted(ran) == list(range(threads)) and saw == [True] * threads, (ran, saw)
    assert downloads.in_background("test-cancel-after", lambda: saw.append(downloads.cancelled()))
    assert downloads.wait_for_downloads(60) and saw[-1] is False


def test_a_failed_read_drops_the_prefetches_waiting(served: FileServer, tmp_path: Path) -> None:
    """The read's own failure cancels this process's background downloads (the failed store
    would fail them too, and the process's exit waits for none): the work still waiting is
    dropped at once, never requested, and a running download stops at its next attempt."""
    with file_server(served.root) as own:  # its own: the stalls it holds end with this test
        own.always(r"^GET /images\.npy/shard-00000\.npy", "403")
        own.always(r"^GET /images\.npy/shard-0*[1-9]\d*\.npy", "stall")
        options = {"backend": "fsspec", "read_timeout": 600, "connect_timeout": 5}
        ds = packer.open_dataset(
            f"{own.endpoint}/images.npy",
            output="bytes",
            cache_dir=tmp_path / "cache",
            storage_options=options,
        )
        shards = len(ds.reader.shard_names)
        started = ds.reader.prefetch(range(1, shards))
        assert started > downloads.PREFETCH_THREADS, started  # some wait for a thread
        with pytest.raises(MissingObject, match="403"):
            ds[0]
        assert downloads.cancel_downloads() == 0  # the failed read dropped them already
        stalled = {s.split()[1] for s in own.seen if s.endswith("-> stall")}
    assert len(stalled) <= downloads.PREFETCH_THREADS, own.seen  # the waiting never went
    assert downloads.wait_for_downloads(300)  # a hang guard: the running stop at once
