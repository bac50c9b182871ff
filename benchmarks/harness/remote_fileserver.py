"""A read-only S3 API over a local folder, fast enough not to be the bottleneck of a benchmark:
``root/<bucket>/<key>`` served as objects — GetObject (with ``Range``), HeadObject, HeadBucket,
ListObjectsV2 (prefix, delimiter, continuation) and GetBucketLocation, answered from the folder
with ``sendfile``; authentication is not checked. Objects are put in place by copying files.

Why not moto here: its server answers ~100–300 requests per second on this machine (each one
goes through its full request dispatch, ~3–6 ms of Python), so a reader that makes one ranged
GET per record would measure moto, not itself; a store such as S3 serves thousands at once.
Run as ``python remote_fileserver.py ROOT``; it prints ``READY <port>``.
"""

from __future__ import annotations

import email.utils
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit
from xml.sax.saxutils import escape

XMLNS = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_KEYS = 1000


def etag(st: os.stat_result) -> str:
    """An entity tag that changes when the file does (size and modification time)."""
    return f'"{st.st_size:x}-{st.st_mtime_ns:x}"'


def iso(ts: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%S.000Z"
    )


def parse_range(value: str, size: int) -> tuple[int, int] | None:
    """``bytes=a-b`` / ``a-`` / ``-n`` → (first, last) inclusive; None: unsatisfiable."""
    spec = value.split("=", 1)[1].strip()
    a, _, b = spec.partition("-")
    if a:
        first, last = int(a), (int(b) if b else size - 1)
    else:
        first, last = max(0, size - int(b)), size - 1
    last = min(last, size - 1)
    return None if first > last or first >= size else (first, last)


def list_keys(bucket: Path, prefix: str, delimiter: str) -> tuple[list[str], list[str]]:
    """Keys under ``prefix`` (sorted) and, with a delimiter, the common prefixes."""
    keys, prefixes = [], set()
    for path in bucket.rglob("*"):
        if not path.is_file():
            continue
        key = path.relative_to(bucket).as_posix()
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix) :]
        if delimiter and delimiter in rest:
            prefixes.add(prefix + rest.split(delimiter, 1)[0] + delimiter)
        else:
            keys.append(key)
    return sorted(keys), sorted(prefixes)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _target(self) -> tuple[str, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
        return bucket, key, parse_qs(parts.query, keep_blank_values=True)

    def _send(self, status: int, body: bytes, ctype: str = "application/xml") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        body = f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code></Error>'
        self._send(status, body.encode())

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        bucket, key, query = self._target()
        root = self.server.root / bucket
        if not bucket or not root.is_dir():
            return self._error(404, "NoSuchBucket")
        if not key:
            if "location" in query:
                return self._send(200, f'<LocationConstraint xmlns="{XMLNS}"/>'.encode())
            if self.command == "HEAD":
                return self._send(200, b"")
            return self._list(bucket, root, query)
        path = root / key
        if ".." in Path(key).parts or not path.is_file():
            return self._error(404, "NoSuchKey")
        self._object(path)

    def _object(self, path: Path) -> None:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            first, last, status = 0, st.st_size - 1, 200
            if self.headers.get("Range"):
                got = parse_range(self.headers["Range"], st.st_size)
                if got is None:
                    return self._error(416, "InvalidRange")
                (first, last), status = got, 206
            self.send_response(status)
            self.send_header("Content-Length", str(last - first + 1))
            self.send_header("Content-Type", "binary/octet-stream")
            self.send_header("ETag", etag(st))
            self.send_header("Last-Modified", email.utils.formatdate(st.st_mtime, usegmt=True))
            self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {first}-{last}/{st.st_size}")
            self.end_headers()
            if self.command == "GET" and last >= first:
                self.wfile.flush()
                self.connection.sendfile(fh, first, last - first + 1)

    def _list(self, bucket: str, root: Path, query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        after = query.get("continuation-token", query.get("start-after", [""]))[0]
        keys, prefixes = list_keys(root, prefix, delimiter)
        keys = [k for k in keys if k > after]
        page, more = keys[:MAX_KEYS], len(keys) > MAX_KEYS
        url = query.get("encoding-type", [""])[0] == "url"
        enc = (lambda k: quote(k, safe="/")) if url else escape
        rows = []
        for key in page:
            st = (root / key).stat()
            rows.append(
                f"<Contents><Key>{enc(key)}</Key><LastModified>{iso(st.st_mtime)}</LastModified>"
                f"<ETag>{escape(etag(st))}</ETag><Size>{st.st_size}</Size>"
                "<StorageClass>STANDARD</StorageClass></Contents>"
            )
        rows += [f"<CommonPrefixes><Prefix>{enc(p)}</Prefix></CommonPrefixes>" for p in prefixes]
        token = f"<NextContinuationToken>{enc(page[-1])}</NextContinuationToken>" if more else ""
        body = (
            f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="{XMLNS}">'
            f"<Name>{bucket}</Name><Prefix>{enc(prefix)}</Prefix>"
            f"<KeyCount>{len(page) + len(prefixes)}</KeyCount><MaxKeys>{MAX_KEYS}</MaxKeys>"
            f"<Delimiter>{enc(delimiter)}</Delimiter><IsTruncated>{str(more).lower()}</IsTruncated>"
            + ("<EncodingType>url</EncodingType>" if url else "")
            + token
            + "".join(rows)
            + "</ListBucketResult>"
        )
        self._send(200, body.encode())


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, root: Path) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.root = root


def main(root: str) -> int:
    with Server(Path(root)) as server:
        print(f"READY {server.server_address[1]}", flush=True)
        server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
