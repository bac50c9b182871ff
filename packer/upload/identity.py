"""Which store a URL reaches, as the staging folder's name needs it (issue 40 items 2, 8, 10).

The staging folder of an upload (:func:`packer.upload.staging.staging_folder`) holds the journal
that lets a run replace or delete objects at the destination, so it must belong to one store:
two runs reach the same folder exactly when their client talks to the same store.

For ``s3://`` that is the endpoint the client resolves, asked of the client itself (an s3fs
file system built as an upload builds it, no request sent): ``endpoint_url`` or
``client_kwargs``, fsspec's configuration (``FSSPEC_S3_ENDPOINT_URL``, ``FSSPEC_S3``, the files
of ``FSSPEC_CONFIG_DIR``), botocore's ``AWS_ENDPOINT_URL[_S3]``, and the ``endpoint_url`` of the
``AWS_PROFILE`` profile in ``AWS_CONFIG_FILE``. It is written one way (:func:`normal_endpoint`):
``http://localhost:9000/`` and ``http://127.0.0.1:9000`` are one store, and so is every regional
endpoint of AWS's S3 in one partition (a bucket's name is unique there).

Nothing else is part of it: not the credentials, the region or the profile's name (who asks,
not which store answers), and not packer's own options (``connect_timeout``, ``read_timeout``,
``min_rate``, ``backend``), so ``--resume --storage-option read_timeout=120`` continues the
run it resumes. For another protocol (``gs://``, ``az://``, ...) it is the storage options with
fsspec's configuration for that protocol, without credentials and packer's own options.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

from packer.errors import PackerError
from packer.remote.obstore_backend import PACKER_OPTIONS

__all__ = ["normal_endpoint", "resolved_endpoint", "store_identity"]

_SECRETS = frozenset(
    {"key", "secret", "token", "password", "aws_access_key_id", "aws_secret_access_key"}
    | {"aws_session_token", "session_token", "account_key", "sas_token", "client_secret"}
)
_LOOPBACK = frozenset({"localhost", "localhost.localdomain", "127.0.0.1", "::1", "ip6-localhost"})
_PORTS = {"http": 80, "https": 443}
_AWS = re.compile(r"(?:^|\.)amazonaws\.com(\.cn)?$")  # s3[.-]<region>[.dualstack].amazonaws.com


def normal_endpoint(endpoint: str) -> str:
    """``endpoint`` written one way: scheme and host in lower case, a loopback name as
    ``127.0.0.1``, the scheme's default port and a trailing ``/`` dropped; AWS's own S3
    endpoints as their partition (``aws``, ``aws-cn``, ``aws-us-gov``)."""
    parts = urlsplit(endpoint.strip())
    host = (parts.hostname or "").lower().rstrip(".")
    aws = _AWS.search(host)
    if aws:  # a partition's buckets share one namespace, whatever the region
        return "aws-cn" if aws.group(1) else "aws-us-gov" if "us-gov-" in host else "aws"
    host = "127.0.0.1" if host in _LOOPBACK else host
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # not a number: kept as written, the client refuses it
        return endpoint.strip().rstrip("/")
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and port != _PORTS.get(scheme):
        netloc += f":{port}"
    return f"{scheme}://{netloc}{parts.path.rstrip('/')}"


def resolved_endpoint(url: str, storage_options: dict[str, Any] | None) -> str:
    """The endpoint the s3 client of ``url`` with ``storage_options`` talks to (see the
    module's docstring), as the client resolved it; no request is sent.

    Raises:
        PackerError: the client cannot be built (an unknown option, a profile not found).
    """
    from packer.remote.storage import RemoteFolder

    folder = RemoteFolder(url, storage_options)
    fs = folder.fs()
    try:
        fs.connect()
        endpoint = str(fs.s3.meta.endpoint_url)
    except Exception as exc:  # noqa: BLE001 - botocore's ProfileNotFound, a bad endpoint, ...
        raise PackerError(
            f"cannot tell which store {url!r} is: the s3 client could not be set up "
            f"({type(exc).__name__}: {exc}). Check AWS_PROFILE and AWS_CONFIG_FILE, "
            "AWS_ENDPOINT_URL and --storage-option endpoint_url=..."
        ) from exc
    return endpoint  # the client's connections close with ``fs`` (s3fs's finalizer)


def store_identity(storage_options: dict[str, Any] | None, url: str = "s3://") -> str:
    """What names the store behind ``url`` besides the URL (see the module's docstring), as
    canonical text: for s3, ``endpoint=`` and the resolved endpoint, written one way."""
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    options = dict(storage_options or {})
    if protocol in ("s3", "s3a"):
        return "endpoint=" + normal_endpoint(resolved_endpoint(url, options))
    from fsspec.config import conf

    merged = {**conf.get(protocol, {}), **options}
    kept = {
        k: v for k, v in merged.items() if k.lower() not in _SECRETS and k not in PACKER_OPTIONS
    }
    return json.dumps(kept, sort_keys=True, default=repr) if kept else ""
