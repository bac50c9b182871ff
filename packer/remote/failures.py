"""What a remote failure is: worth another try (:func:`passing`: a reset, a cut body, 429, 5xx —
also when fsspec's HTTP ``info`` wraps a 500 as a FileNotFoundError), a missing or denied object
(:class:`MissingObject`), or another error; and how a message names it (:func:`failure`: the
HTTP status, the watchdog's reason when it cut the connection). ``packer.remote.storage`` raises
them for every request.
"""

from __future__ import annotations

import asyncio
import re

from packer.errors import FormatError, PackerError
from packer.remote.watchdog import cut_reason

__all__ = ["MissingObject", "Passing", "failure", "http_status", "passing", "remote_error"]

# 403/404 as a status, not as digits of a port or a name ("http://127.0.0.1:40404/x" is no 404)
_MISSING_TEXT = re.compile(r"(?<![\w:/.-])(403|404)(?![\w.])|NoSuchKey|NoSuchBucket|Forbidden")


def http_status(exc: BaseException | None) -> int | None:
    """The HTTP status an exception or what it was raised from carries (aiohttp's
    ``ClientResponseError``, which fsspec's HTTP ``info`` raises a FileNotFoundError from
    whatever the status: a 500 too), or None."""
    for _ in range(8):
        if exc is None:
            return None
        status = getattr(exc, "status", None)
        if isinstance(status, int) and 100 <= status < 600:
            return status
        exc = exc.__cause__ or exc.__context__
    return None


def _missing(exc: BaseException) -> bool:
    if isinstance(exc, (FileNotFoundError, PermissionError)):
        return True
    return _MISSING_TEXT.search(str(exc)) is not None


_PASSING_TYPES = frozenset(  # FlexibleChecksumError: botocore found the body corrupt
    (
        "ClientPayloadError ServerDisconnectedError ClientOSError ClientConnectionError "
        "ClientConnectorError IncompleteRead IncompleteReadError ResponseStreamingError "
        "EndpointConnectionError ConnectionClosedError ReadTimeoutError ConnectTimeoutError "
        "FSTimeoutError ResponseParserError HTTPClientError FlexibleChecksumError Passing"
    ).split()
)
_PASSING_TEXT = re.compile(
    r"\b(429|500|502|503|504)\b|SlowDown|ServiceUnavailable|Throttl|TooManyRequests|"
    r"InternalError|RequestTimeout|reduce your request rate"
)


class Passing(Exception):
    """A failure worth another try (a cut body, a reset, 429, 5xx), naming the object."""


def passing(exc: BaseException) -> bool:
    """Whether ``exc`` is worth another try: a reset or timed-out connection, a body cut
    short, HTTP 429 or 5xx. A missing object or a denied access (404, 403) is not."""
    status = http_status(exc)  # fsspec's HTTP info raises FileNotFoundError from a 500 too
    if status is not None and (status >= 500 or status in (408, 429)):
        return True
    seen: BaseException | None = exc
    for _ in range(8):  # the exception and what it was raised from
        if seen is None or _missing(seen) or isinstance(seen, PackerError):
            return False
        if isinstance(seen, (ConnectionError, TimeoutError, asyncio.TimeoutError)):
            return True
        if type(seen).__name__ in _PASSING_TYPES or _PASSING_TEXT.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def failure(exc: BaseException) -> str:
    """``exc`` as a message names it: its type and text, and the watchdog's reason when it cut
    the connection (a client's wrapping says "could not connect" instead)."""
    what = f"{type(exc).__name__}: {exc}".strip()
    status = http_status(exc)
    if status is not None and str(status) not in what:
        kind = "a server error" if status >= 500 else "the server's answer"
        what += f" (HTTP {status} from the server: {kind})"
    why = cut_reason(exc)
    return what if why is None or why in what else f"{what} ({why})"


class MissingObject(FormatError):
    """An object the store says is not there (``denied``: or that access to it is denied)."""

    def __init__(self, message: str, denied: bool = True) -> None:
        super().__init__(message)
        self.denied = denied


_DENIED_TEXT = re.compile(
    r"(?<![\w:/.-])403(?![\w.])|Forbidden|AccessDenied|InvalidAccessKeyId|Signature"
)


def _denied(exc: BaseException) -> bool:
    """Whether a missing-or-denied failure may be a denial (403, a refused key), not a 404."""
    status = http_status(exc)
    if status is not None:
        return status == 403
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, PermissionError) or _DENIED_TEXT.search(str(seen)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def remote_error(url: str, exc: BaseException) -> PackerError:
    """A packer error naming ``url`` for any exception of fsspec or its backend."""
    if isinstance(exc, PackerError):
        return exc
    what = failure(exc)
    if "not satisfiable" in str(exc) or "InvalidRange" in str(exc):
        return FormatError(
            f"{url!r} is shorter than a record the dataset's tables place in it ({what}): the "
            "object is truncated or was replaced after the conversion; upload the output again"
        )
    if _missing(exc):
        return MissingObject(
            f"cannot read {url!r}: the object is missing or access is denied ({what}). Check "
            "the URL, the credentials (AWS_ACCESS_KEY_ID, a profile, an instance role) and the "
            "endpoint (storage_options={'endpoint_url': ...})",
            denied=_denied(exc),
        )
    return PackerError(f"cannot read {url!r}: {what}. Check the network and the endpoint")
