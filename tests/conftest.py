"""Shared fixtures: tiny real image trees made by the same generator as `make demo`; a real S3
API server (one per test process, a bucket per module: its ``BUCKET``) and the fault proxy for
the remote tests."""

from __future__ import annotations

import compileall
import json
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from multiprocessing import forkserver
from pathlib import Path

import pytest
from fault_proxy import FaultProxy, fault_proxy
from s3_server import CREDENTIALS, S3Server, moto_endpoint, s3_bucket, share_botocore_models

import packer
from packer.core.manifest import MANIFEST_NAME
from packer.demo.image import DemoTree, make_image_tree
from packer.formats import FORMATS

_FIRST: dict[str, str] = {}
for _suffix, _module in FORMATS.items():
    _FIRST.setdefault(_module.NAME, _suffix)
SUFFIXES = sorted(_FIRST.values())  # one suffix per format: .bmp .h5 .lmdb .npy

share_botocore_models()  # botocore's JSON models parsed once per test process, not per client

# With PYTHONDONTWRITEBYTECODE set (this machine, some CI images), pytest rewrote and compiled
# all ~140 test modules again in every xdist worker: 4 of a worker's 10 CPU-s of collection.
# The test processes write their bytecode (tests/__pycache__, ignored by git); the processes
# they start inherit the variable (the kill tests set it themselves: no .pyc write to kill at).
sys.dont_write_bytecode = False

if os.environ.get("PACKER_TEST_CPU"):  # each test's CPU-seconds (tests/cpu_report.py)
    pytest_plugins = ["cpu_report"]


def pytest_configure(config: pytest.Config) -> None:
    """Compile packer's modules to bytecode once, before any test starts a process.

    The suite starts hundreds of Python processes (CLI runs, kill tests, spawned workers), and
    with ``PYTHONDONTWRITEBYTECODE`` set (the kill tests set it so that no ``.pyc`` write shows up
    as a kill point; some machines set it globally) each one compiled ~90 modules from source:
    0.22 s of a 0.75 s conversion. Bytecode already on disk is read even so.
    """
    if not hasattr(config, "workerinput"):  # the xdist controller, or a plain run
        compileall.compile_dir(Path(packer.__file__).parent, quiet=1, workers=1)
    _start_forkserver()


def _start_forkserver() -> None:
    """One forkserver per test process, torch imported in it once: a DataLoader worker under
    ``forkserver`` is a fresh process (its dataset pickled, nothing of the test's state
    inherited, as under spawn) that costs a fork instead of a ~2 CPU-s import of torch. It
    starts now, with the S3 test credentials in its environment (the forkserver's children
    inherit its environment, not the test's), so the remote tests' workers reach moto."""
    multiprocessing.set_forkserver_preload(["torch", "torch.utils.data"])
    saved = dict(os.environ)
    os.environ.update(CREDENTIALS)
    try:
        forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Stop the forkserver and wait for it: its CPU and its children's (the DataLoader workers
    it forked and reaped) count in this process's, as a spawned worker's would."""
    forkserver._forkserver._stop()


@pytest.fixture(scope="session")
def tree(tmp_path_factory: pytest.TempPathFactory) -> DemoTree:
    """3 classes × 4 small photo-like JPEGs, plus one truncated JPEG."""
    return make_image_tree(
        tmp_path_factory.mktemp("src") / "images", classes=3, per_class=4, size=(64, 48), bad=1
    )


@pytest.fixture(scope="session")
def packed(tree: DemoTree, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tree converted once into every format, keyed by suffix."""
    out = tmp_path_factory.mktemp("packed")
    result = {}
    for suffix in SUFFIXES:
        dst = out / f"images{suffix}"
        packer.convert(tree.root, dst, shard_size="20kB", workers=2, progress=False)
        result[suffix] = dst
    return result


@pytest.fixture(scope="session")
def clean(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """3 classes × 4 JPEGs without a broken one (decode modes read every file), and its LMDB and
    NPY copies: the data of the bench and doctor tests, which read it and never write to it."""
    root = tmp_path_factory.mktemp("clean")
    tree = make_image_tree(root / "images", classes=3, per_class=4, size=(64, 48), bad=0)
    out = {"folder": tree.root}
    for suffix in (".lmdb", ".npy"):
        out[suffix] = root / f"images{suffix}"
        packer.convert(tree.root, out[suffix], shard_size="20kB", workers=2, progress=False)
    return out


@pytest.fixture(params=SUFFIXES)
def suffix(request: pytest.FixtureRequest) -> str:
    """Every format's suffix in turn."""
    return str(request.param)


def _tree_files(root: Path) -> dict[str, bytes]:
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == MANIFEST_NAME:
                manifest = json.loads(data)
                manifest.pop("created")
                data = json.dumps(manifest, sort_keys=True).encode()
            files[str(path.relative_to(root))] = data
    return files


@pytest.fixture
def tree_files() -> Callable[[Path], dict[str, bytes]]:
    """Every file under a folder, relative path -> bytes (the manifest without its time)."""
    return _tree_files


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """One real S3 API server (moto) on the loopback per test process (xdist worker): starting
    one per module cost ~0.5 CPU-s and ~3 s each, ~30 times."""
    with moto_endpoint() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, s3_endpoint: str) -> Iterator[S3Server]:
    """The process's S3 server for the module, with its bucket (the module's ``BUCKET``) and the
    test credentials in the environment while the module runs."""
    with s3_bucket(s3_endpoint, getattr(request.module, "BUCKET", "data")) as running:
        yield running


@pytest.fixture(scope="module")
def proxy(server: S3Server) -> Iterator[FaultProxy]:
    """The fault-injecting proxy in front of the module's server."""
    with fault_proxy(server.endpoint) as running:
        yield running


@pytest.fixture
def whole_shards(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads through the shard cache wait for their shards' downloads (no record served by a
    ranged GET first) and fetch no shard ahead of an in-order reader: the tests that attack the
    cache's downloads, its locks and its limit, each download where the test expects it. Held
    in this process and forked workers (a spawned one starts with the defaults)."""
    from packer.remote import cached_reader

    monkeypatch.setattr(cached_reader, "RANGED_SHARE", 0.0)
    monkeypatch.setattr(cached_reader, "RANGED_FLOOR", 0)
    monkeypatch.setattr(cached_reader, "AHEAD", 0)


_TUNING = {  # module constants tests lower for a while: each must be back after every test
    "packer.remote.cached_reader": ("RANGED_SHARE", "RANGED_FLOOR", "AHEAD", "IN_ORDER"),
    "packer.remote.downloads": ("PREFETCH_THREADS",),
    "packer.read.rows": ("BLOCK",),
}


@pytest.fixture(autouse=True)
def _tuning_restored() -> Iterator[None]:
    """A test that sets a tuning constant without monkeypatch leaks it into every later test of
    its process (one left ``AHEAD = 0``: no read-ahead, a read-ahead test failed far away):
    such a test errors here, and the default comes back."""
    import importlib

    modules = {name: importlib.import_module(name) for name in _TUNING}
    before = {(m, a): getattr(modules[m], a) for m, attrs in _TUNING.items() for a in attrs}
    yield
    leaked = {
        k: getattr(modules[k[0]], k[1])
        for k, v in before.items()
        if getattr(modules[k[0]], k[1]) != v
    }
    for module, attr in leaked:
        setattr(modules[module], attr, before[(module, attr)])
    if leaked:
        pytest.fail(f"the test left tuning constants changed: {leaked} (use monkeypatch)")
