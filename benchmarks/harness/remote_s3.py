"""The loopback object store of ``benchmarks/remote.py``: moto's S3 server in its own process,
behind the latency-and-bandwidth proxy (:mod:`harness.remote_proxy`) in another.

moto reads a whole object out of its buffer for every GET, a ranged one too (``FakeKey.value``
copies the object, then the range is sliced from the copy): a 16 MB shard cost a 16 MB copy per
ranged GET, which a real store does not pay and which would charge range readers for the
server's shortcut. The server process here keeps each object's bytes once, immutable, next to
moto's buffer (:func:`serve_ranges_cheaply`), so a range costs a slice of its own size.

``python remote_s3.py`` runs the server and prints ``READY <port>``; :class:`LoopbackStore`
starts a server (moto, or by default the faster read-only one of
:mod:`harness.remote_fileserver`) and the proxy, each its own process, and stops them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
HERE = Path(__file__).resolve().parent


def serve_ranges_cheaply() -> None:
    """Make moto's ``FakeKey.value`` return one cached ``bytes`` per object version instead of a
    fresh copy of the whole object per call (cleared when the value is set again)."""
    from moto.s3.models import FakeKey

    prop = FakeKey.value

    def get(self: Any) -> bytes:
        cached = self.__dict__.get("_bench_bytes")
        if cached is None:
            cached = prop.fget(self)
            self.__dict__["_bench_bytes"] = cached
        return cached

    def set_(self: Any, value: bytes) -> None:
        self.__dict__.pop("_bench_bytes", None)
        prop.fset(self, value)

    FakeKey.value = property(get, set_)


def serve() -> int:
    """Run moto's S3 server on 127.0.0.1 (a free port) until killed."""
    import logging

    from moto.moto_server.threaded_moto_server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a log line per request costs CPU
    serve_ranges_cheaply()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(f"READY {server.get_host_and_port()[1]}", flush=True)
    while True:
        time.sleep(3600)


def _start(cmd: list[str]) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY "):
        proc.kill()
        raise RuntimeError(f"{cmd[1]} did not start: {line!r}")
    return proc, int(line.split()[1])


class LoopbackStore:
    """moto's S3 server and the proxy in front of it, as subprocesses; a context manager.

    ``endpoint`` is the proxy (what readers get), ``direct`` the server (uploads go there, not
    through the proxy); :meth:`stats` and :meth:`reset` read and zero the proxy's counters.
    """

    def __init__(
        self,
        latency_ms: float,
        bandwidth_mbps: float,
        root: Path,
        server: str = "files",
        bucket: str = "bench",
    ) -> None:
        self.kind = server
        self.root = root
        self.latency_ms = latency_ms
        self.bandwidth_mbps = bandwidth_mbps
        self.bucket = bucket
        self.procs: list[subprocess.Popen[str]] = []

    def __enter__(self) -> LoopbackStore:
        try:
            return self._start()
        except BaseException:
            self.__exit__()
            raise

    def _start(self) -> LoopbackStore:
        os.environ.update(CREDENTIALS)
        if self.kind == "moto":
            server, port = _start([sys.executable, str(HERE / "remote_s3.py")])
        else:
            (self.root / self.bucket).mkdir(parents=True, exist_ok=True)
            server, port = _start(
                [sys.executable, str(HERE / "remote_fileserver.py"), str(self.root)]
            )
        self.procs.append(server)
        self.direct = f"http://127.0.0.1:{port}"
        proxy, pport = _start(
            [
                sys.executable,
                str(HERE / "remote_proxy.py"),
                f"--upstream={self.direct}",
                f"--latency-ms={self.latency_ms}",
                f"--bandwidth-mbps={self.bandwidth_mbps}",
                *(["--log"] if os.environ.get("REMOTE_PROXY_LOG") else []),
            ]
        )
        self.procs.append(proxy)
        self.endpoint = f"http://127.0.0.1:{pport}"
        if self.kind == "moto":
            self.client().create_bucket(Bucket=self.bucket)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.direct, region_name="us-east-1")

    def upload(self, local: Path, name: str) -> str:
        """Put every file under ``local`` at ``s3://bucket/name/...`` (straight to the server,
        not through the proxy); return the URL."""
        if self.kind != "moto":
            dst = self.root / self.bucket / name
            if dst.exists():
                shutil.rmtree(dst)
            shutil.copytree(local, dst)
            return f"s3://{self.bucket}/{name}"
        client = self.client()
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            key = f"{name}/{path.relative_to(local).as_posix()}"
            client.upload_file(str(path), self.bucket, key)
        return f"s3://{self.bucket}/{name}"

    def cpu(self) -> dict[str, float]:
        """CPU seconds used so far by the server and by the proxy (Linux ``/proc``)."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {}
        for name, proc in zip(("server", "proxy"), self.procs):
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        return out

    def _proxy(self, what: str) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.endpoint}/__proxy__/{what}", timeout=30) as r:
            return json.loads(r.read())

    def stats(self) -> dict[str, int]:
        return self._proxy("stats")

    def reset(self) -> dict[str, int]:
        return self._proxy("reset")


if __name__ == "__main__":
    sys.exit(serve())
