"""The obstore backend of :class:`packer.remote.storage.RemoteFolder`: ranged GETs of ``s3://`` and
``http(s)://`` objects through obstore (Rust's ``object_store``), ~0.2 CPU ms per GET against
~1.4 ms through s3fs/aiobotocore (``benchmarks/results/HISTORY.md``, "A faster read backend").

**Choice.** ``storage_options={"backend": "obstore" | "fsspec"}`` (taken out before fsspec sees
the options), else ``$PACKER_REMOTE_BACKEND``, else obstore when it is installed, reads the URL's
scheme and honours every option given, else fsspec. It pays: ``benchmarks/remote_backends.py``
(20 ms per request, two workers) reads a shuffled epoch 1.4-1.8x faster with a third of the
reader's CPU, and never slower beyond the machine's noise.

Only the hot path comes here: the batches of byte ranges of :meth:`RemoteFolder.read_runs` (and
so :meth:`RemoteFolder.download`). Metadata requests, streamed checksums and every write stay on
fsspec, so the retry layer, the identities recorded at open and the error messages are the
storage layer's own, whichever backend fetched the bytes. obstore's own retries are off.

**Fork.** obstore's tokio runtime threads are not inherited by a forked child, which would hang
in its first call (tokio-rs/tokio#4301, developmentseed/obstore#441). So the process that first
used obstore is recorded (:data:`_RUNTIME_PID`); a forked child of it reads through fsspec, with
the same bytes and checks (:func:`usable`). The usual pattern — open in the parent (metadata:
fsspec), then ``DataLoader`` workers by fork — keeps obstore in every worker; spawned and
forkserver workers start clean and always use obstore.
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
import os
import re
import threading
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from packer.core.sizes import BOUNDS, bounds
from packer.errors import PackerError

__all__ = [
    "BACKENDS",
    "POOL",
    "ObstoreRanges",
    "backend_of",
    "fsspec_options",
    "obstore_config",
    "usable",
]

BACKENDS = ("fsspec", "obstore")
ENV = "PACKER_REMOTE_BACKEND"  # the default backend when storage_options do not name one
SCHEMES = ("s3", "s3a", "http", "https")

_RUNTIME_PID: int | None = None  # the process whose obstore call started its tokio runtime
_LOCK = threading.Lock()
_IO: tuple[int, asyncio.AbstractEventLoop] | None = None  # (pid, the loop of obstore's futures)

# s3fs options with no meaning for a ranged read (fsspec caching, listings, the event loop)
_IGNORED = frozenset(
    (
        "skip_instance_cache use_listings_cache listings_expiry_time max_paths "
        "default_block_size default_cache_type default_fill_cache cache_regions asynchronous "
        "loop retries version_aware fixed_upload_size s3_additional_kwargs"
    ).split()
)
_IGNORED_CONFIG = frozenset(
    {
        "retries",  # packer's RETRY is the one retry layer
        "max_pool_connections",  # honoured: the requests in flight at once
        "request_checksum_calculation",  # for writes, which stay on fsspec
        "tcp_keepalive",
    }
)
_BODY_TROUBLE = re.compile(
    r"error decoding response body|connection closed|connection reset|broken pipe|"
    r"unexpected end|incomplete|end of file|timed out|timeout|error sending request|"
    r"body error|connect|dns error|"
    r"non-partial response|Requested \d+\.\.\d+, got|content-range|range request not",
    re.IGNORECASE,
)


POOL = 64  # connections an s3 client keeps (botocore's default, 10, caps a batch's ranged GETs)
_FSSPEC_BASE = ("skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths")
PACKER_OPTIONS = ("backend", *BOUNDS)  # taken out before a backend sees the options


def fsspec_options(protocol: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` as fsspec gets them: without packer's own, with packer's timeouts (unless
    set), and for s3 checked, with botocore's retries off unless set (:data:`RETRY` is the one
    layer) and a pool of :data:`POOL` connections unless set (a shuffled batch's ~50 ranged GETs
    together: 268 → 154 ms a batch in ``benchmarks/harness/remote_clients.py``)."""
    limits = bounds(options)
    options = {k: v for k, v in options.items() if k not in PACKER_OPTIONS}
    if protocol in ("http", "https"):  # aiohttp's default: 300 s for the whole request
        import aiohttp

        kwargs = dict(options.get("client_kwargs") or {})
        kwargs.setdefault(  # no cap on a whole transfer: packer's bound scales with its bytes
            "timeout",
            aiohttp.ClientTimeout(
                total=None, sock_connect=limits["connect_timeout"], sock_read=limits["read_timeout"]
            ),
        )
        return {**options, "client_kwargs": kwargs}
    if protocol not in ("s3", "s3a"):
        return options
    _known_to_s3fs(options)
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"total_max_attempts": 1})
    config.setdefault("max_pool_connections", POOL)
    config.setdefault("connect_timeout", limits["connect_timeout"])
    config.setdefault("read_timeout", limits["read_timeout"])
    return {**options, "config_kwargs": config}


def _known_to_s3fs(options: dict[str, Any]) -> None:
    """s3fs takes an unknown option silently (then the network fails): name it and the rest."""
    import s3fs

    known = {*inspect.signature(s3fs.S3FileSystem.__init__).parameters, *_FSSPEC_BASE}
    known = (known | {"retries"}) - {"self", "kwargs"}  # retries: fs.retries (RemoteFolder.fs)
    for name in sorted(set(options) - known):
        near = difflib.get_close_matches(name, sorted(known), 1)
        raise PackerError(
            f"storage option {name!r} is unknown to s3 (s3fs)"
            + (f" (did you mean {near[0]}?)" if near else "")
            + f". Known: {', '.join(sorted(known | set(PACKER_OPTIONS)))} (--storage-option KEY=VALUE)"
        )


def backend_of(options: dict[str, Any], url: str = "s3://") -> str:
    """The read backend of ``url``: the one ``options`` (``backend=``) or
    ``$PACKER_REMOTE_BACKEND`` names; when neither does, ``"obstore"`` if it is installed, reads
    ``url``'s scheme and honours every option given (else ``"fsspec"``: e.g. botocore's
    ``response_checksum_validation``).

    Raises:
        PackerError: an unknown backend; obstore named but not installed, or not for ``url``.
    """
    given = options.get("backend") or os.environ.get(ENV) or ""
    if given not in ("", *BACKENDS):
        where = "storage_options['backend']" if options.get("backend") else f"${ENV}"
        raise PackerError(
            f"{where} is {given!r}; expected one of {', '.join(BACKENDS)} "
            "(obstore: faster ranged reads of s3:// and http(s)://; fsspec: any protocol)"
        )
    if given == "fsspec" or (not given and url.split("://", 1)[0] not in SCHEMES):
        return "fsspec"
    if url.split("://", 1)[0] not in SCHEMES:
        raise PackerError(
            f"the obstore backend reads {', '.join(s + '://' for s in SCHEMES)} only, not "
            f"{url!r}; choose backend='fsspec'"
        )
    try:
        import obstore  # noqa: F401
    except ImportError as exc:
        if not given:
            return "fsspec"
        raise PackerError(
            'the obstore backend needs obstore: pip install "packer-datasets[remote]", or '
            "choose backend='fsspec'"
        ) from exc
    if not given:
        try:
            obstore_config(options)
        except PackerError:
            return "fsspec"
    return "obstore"


def usable() -> bool:
    """Whether this process may call obstore (no parent it was forked from started it)."""
    return _RUNTIME_PID is None or _RUNTIME_PID == os.getpid()


def _started() -> None:
    global _RUNTIME_PID
    with _LOCK:
        if _RUNTIME_PID is None:
            _RUNTIME_PID = os.getpid()


def obstore_config(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """s3fs-style ``options`` as obstore's S3 config and client options, and whether to take
    credentials from botocore's chain (no key, not anonymous).

    Raises:
        PackerError: an option obstore cannot honour (it names the option and the way out).
    """
    config: dict[str, Any] = {}
    client: dict[str, Any] = {}
    limits = bounds(options)
    client["connect_timeout"] = f"{limits['connect_timeout']}s"
    client["read_timeout"] = f"{limits['read_timeout']}s"
    client["timeout"] = "86400s"  # not obstore's 30 s for a whole GET: packer bounds attempts
    rest = {k: v for k, v in options.items() if k not in PACKER_OPTIONS and k not in _IGNORED}
    kwargs = dict(rest.pop("client_kwargs", None) or {})
    settings = dict(rest.pop("config_kwargs", None) or {})
    endpoint = rest.pop("endpoint_url", None) or kwargs.pop("endpoint_url", None)
    if endpoint:
        config["endpoint"] = str(endpoint)
        client["allow_http"] = str(endpoint).startswith("http://")
    for ours, theirs in (("key", "access_key_id"), ("secret", "secret_access_key")):
        if rest.get(ours):
            config[theirs] = str(rest.pop(ours))
        rest.pop(ours, None)
    if rest.get("token"):
        config["session_token"] = str(rest.pop("token"))
    rest.pop("token", None)
    anon = bool(rest.pop("anon", False))
    if anon or str(settings.pop("signature_version", "")).upper() == "UNSIGNED":
        config["skip_signature"] = True
        anon = True
    if rest.pop("requester_pays", False):
        config["request_payer"] = True
    region = kwargs.pop("region_name", None) or rest.pop("region_name", None)
    config["region"] = str(region or _default_region())
    if kwargs.pop("verify", True) is False:
        client["allow_invalid_certificates"] = True
    addressing = (settings.pop("s3", None) or {}).get("addressing_style")
    if addressing == "virtual":
        config["virtual_hosted_style_request"] = True
    for ours, theirs in (("connect_timeout", "connect_timeout"), ("read_timeout", "read_timeout")):
        if ours in settings:
            client[theirs] = f"{float(settings.pop(ours))}s"
    left = sorted({*rest, *kwargs, *(k for k in settings if k not in _IGNORED_CONFIG)})
    if left:
        raise PackerError(
            f"storage option(s) {', '.join(left)} are not understood by the obstore backend "
            "(it understands endpoint_url, key, secret, token, anon, requester_pays, "
            "client_kwargs region_name/verify, config_kwargs timeouts and addressing_style); "
            "pass storage_options={'backend': 'fsspec', ...} to read through s3fs"
        )
    return config, client, not anon and "access_key_id" not in config


def _default_region() -> str:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        if os.environ.get(name):
            return os.environ[name]
    try:
        import botocore.session

        return str(botocore.session.get_session().get_config_variable("region") or "us-east-1")
    except Exception:  # botocore absent or its config unreadable: S3's own default
        return "us-east-1"


class _BotocoreCredentials:
    """obstore's credential callback over botocore's chain (environment, shared config and
    credentials files, SSO, container and instance roles): the same credentials s3fs finds."""

    def __init__(self) -> None:
        self.session: Any = None

    def __call__(self) -> dict[str, Any]:
        import datetime

        import botocore.session

        self.session = self.session or botocore.session.get_session()
        found = self.session.get_credentials()
        if found is None:
            raise PackerError(
                "no AWS credentials found (environment, ~/.aws, instance role); set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or pass anon=True for a public bucket"
            )
        frozen = found.get_frozen_credentials()
        soon = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
        return {
            "access_key_id": frozen.access_key,
            "secret_access_key": frozen.secret_key,
            "token": frozen.token,
            "expires_at": soon,  # asked again then: rotated role credentials are followed
        }


class ObstoreRanges:
    """``cat_ranges`` of one folder's objects through obstore: built per process by
    :meth:`RemoteFolder.reader`, holding one store per bucket (or HTTP origin).

    Args:
        options: the folder's s3fs-style storage options (checked at once).
    """

    async_impl = True  # takes timeout= as fsspec's async file systems do

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        self.config, self.client, self.chain = obstore_config(options)
        self.stores: dict[str, Any] = {}
        self.pool = int((options.get("config_kwargs") or {}).get("max_pool_connections") or POOL)

    def _store(self, url: str) -> tuple[Any, str]:
        """The store of ``url`` and the object's path in it."""
        parts = urlsplit(url)
        if parts.scheme in ("s3", "s3a"):
            root, path = parts.netloc, parts.path.lstrip("/")
        elif parts.scheme in ("http", "https"):
            root, path = f"{parts.scheme}://{parts.netloc}", unquote(parts.path.lstrip("/"))
        else:
            raise PackerError(f"the obstore backend reads s3:// and http(s):// only, not {url!r}")
        if root not in self.stores:
            self.stores[root] = self._build(root)
        return self.stores[root], path

    def _build(self, root: str) -> Any:
        from obstore.store import HTTPStore, S3Store

        given: dict[str, Any] = {"retry_config": {"max_retries": 0}}  # packer's RETRY only
        given["client_options"] = self.client
        if root.startswith(("http://", "https://")):
            given["client_options"] = {"allow_http": root.startswith("http://"), **self.client}
            return HTTPStore.from_url(root, **given)
        if self.chain and not os.environ.get("AWS_ACCESS_KEY_ID") and _has_botocore():
            given["credential_provider"] = _BotocoreCredentials()  # profiles, SSO, roles
        given["config"] = self.config
        return S3Store(root, **given)

    def cat_ranges(
        self,
        urls: Sequence[str],
        starts: Sequence[int],
        stops: Sequence[int],
        on_error: str = "return",
        timeout: float | None = None,
    ) -> list[Any]:
        """``urls[k]``'s bytes ``starts[k]:stops[k]`` for every ``k``, or the exception that
        stopped them (as fsspec's ``on_error="return"``): one GET each, at most ``pool`` in
        flight together (``config_kwargs={"max_pool_connections": n}``, else
        :data:`POOL`); past ``timeout`` seconds, every GET is cancelled and TimeoutError
        raised."""
        _started()
        work = asyncio.wait_for(self._gather(urls, starts, stops), timeout)
        return asyncio.run_coroutine_threadsafe(work, _loop()).result()

    async def _gather(
        self, urls: Sequence[str], starts: Sequence[int], stops: Sequence[int]
    ) -> list[Any]:
        import obstore

        gate = asyncio.Semaphore(self.pool)

        async def one(url: str, start: int, stop: int) -> Any:
            async with gate:
                try:
                    store, path = self._store(url)
                    return await obstore.get_range_async(store, path, start=start, end=stop)
                except Exception as exc:
                    return _plain(url, exc)

        return await asyncio.gather(*(one(*run) for run in zip(urls, starts, stops)))


def _loop() -> asyncio.AbstractEventLoop:
    """This process's event loop for obstore's futures, run by a thread of its own (as fsspec
    does): a caller whose thread already runs a loop (Jupyter) is served too, and the loop is
    kept (``asyncio.run`` per batch, a loop made and closed each time, cost 68 CPU ms per
    1.5 MB range against ~1 ms on a kept loop)."""
    global _IO
    with _LOCK:
        if _IO is None or _IO[0] != os.getpid():
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="packer-obstore", daemon=True).start()
            _IO = (os.getpid(), loop)
        return _IO[1]


def _has_botocore() -> bool:
    try:
        import botocore.session  # noqa: F401
    except ImportError:
        return False
    return True


class ObstoreError(Exception):
    """An obstore failure, its text cut to the first paragraph without timings."""


def _plain(url: str, exc: BaseException) -> BaseException:
    """obstore's exception as :func:`packer.remote.storage.passing` and ``remote_error`` read fsspec's:
    denied → PermissionError, missing → FileNotFoundError, a cut or reset body or a refused
    connection, a bad answer to a Range (200, another Content-Range) → ConnectionError (passing); another status keeps its code in the text (429 and
    5xx passing). obstore's debug dump and timings ("in 429.1µs") are left out: a number in
    them must not pass for a status."""
    from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

    first = str(exc).split("\n\nDebug source", 1)[0].strip()
    first = re.sub(r" in [0-9.]+ ?(ns|µs|us|ms|s)\b", "", first)
    found = re.search(r"status code: (\d{3})", first)
    status = int(found.group(1)) if found else None
    text = f"{url}: {first}"
    if isinstance(exc, (PermissionDeniedError, UnauthenticatedError)) or status in (401, 403):
        return PermissionError(text)
    if isinstance(exc, FileNotFoundError) or status == 404:
        return FileNotFoundError(text)
    if status is None and _BODY_TROUBLE.search(first):
        return ConnectionError(text)
    return ObstoreError(text)
