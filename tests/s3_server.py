"""A real S3 API server on the loopback for the remote tests: moto's server mode in a thread of
the test process, reached by the real s3fs/botocore client through ``endpoint_url``."""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def _called_by_moto() -> bool:
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__", "").startswith("moto."):
            return True
        frame = frame.f_back
    return False


def share_botocore_models() -> None:
    """Each new botocore session (every ``S3FileSystem`` packer or a test makes: ~5 a remote
    test) parses the S3 service model, its endpoint rules and the endpoints again from gzipped
    JSON into OrderedDicts, ~0.15 CPU-s a session. In a test process each file is parsed once:
    the same tree handed to every session, as botocore's own loader does for the clients of one
    session; moto, in this process too, changes the service model it is given: it gets a fresh
    copy (kept pickled) each time. Spawned workers and CLI processes parse their own."""
    from botocore import loaders

    if getattr(loaders.JSONFileLoader.load_file, "shared", False):
        return
    load: Callable[[Any, str], Any] = loaders.JSONFileLoader.load_file
    parsed: dict[str, Any] = {}
    copies: dict[str, bytes] = {}
    lock = threading.Lock()

    def load_file(self: Any, file_path: str) -> Any:
        if "/botocore/data/" not in file_path:
            return load(self, file_path)  # moto's own models
        with lock:
            if file_path not in parsed:
                tree = load(self, file_path)
                parsed[file_path] = tree
                if file_path.endswith("/service-2"):
                    copies[file_path] = pickle.dumps(tree, protocol=5)
            tree = parsed[file_path]
            if file_path in copies and _called_by_moto():
                return pickle.loads(copies[file_path])
            return tree

    load_file.shared = True  # type: ignore[attr-defined]
    loaders.JSONFileLoader.load_file = load_file  # type: ignore[method-assign]

    # and each session listed botocore's ~400 service folders (a stat of each) again
    list_services: Callable[[Any, str], list[str]] = loaders.Loader.list_available_services
    listed: dict[tuple[tuple[str, ...], str], list[str]] = {}

    def list_available_services(self: Any, type_name: str) -> list[str]:
        key = (tuple(self.search_paths), type_name)
        with lock:
            if key not in listed:
                listed[key] = list_services(self, type_name)
            return list(listed[key])

    loaders.Loader.list_available_services = list_available_services  # type: ignore[method-assign]


@dataclass
class S3Server:
    """A running server: its endpoint, the storage options that reach it, a bucket."""

    endpoint: str
    bucket: str

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint}

    def filesystem(self) -> Any:
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.options)

    def upload(self, local: Path, name: str) -> str:
        """Put the folder ``local`` at ``s3://bucket/name``; return that URL."""
        url = f"s3://{self.bucket}/{name}"
        self.filesystem().put(str(local), url, recursive=True)
        return url


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1 (a free port); yield its endpoint; stop it after."""
    # never a skip: `make test` installs moto[server] (dev extra) and s3fs (remote extra)
    from moto import server as moto_server

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextmanager
def s3_bucket(endpoint: str, bucket: str = "data") -> Iterator[S3Server]:
    """The running server at ``endpoint`` with test credentials in the environment (inherited by
    spawned workers) and the bucket ``bucket`` (made if missing; moto's state is per process, so
    a bucket of an earlier module on this server keeps its objects, as it did on a new server in
    the same process); the environment restored after."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in CREDENTIALS.items():
            mp.setenv(key, value)
        running = S3Server(endpoint, bucket)
        fs = running.filesystem()  # one client session: each costs ~0.05 CPU-s
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        yield running


@contextmanager
def s3_server(bucket: str = "data") -> Iterator[S3Server]:
    """A server of its own with one bucket (see :func:`s3_bucket`); stopped after."""
    with moto_endpoint() as endpoint, s3_bucket(endpoint, bucket) as running:
        yield running
