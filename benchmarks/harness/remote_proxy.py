"""A store far away, on the loopback: a threaded HTTP/1.1 proxy between the readers and the S3
server that holds every request ``latency`` seconds before forwarding it and paces every
response's bytes through one shared token bucket (the link's bandwidth), counting what it serves.

Run it as its own process (``python remote_proxy.py --upstream URL --port 0 ...``) so it does not
share a GIL with the readers; it prints ``READY <port>`` on stdout once it listens. Two paths are
answered by the proxy itself, never forwarded:

- ``GET /__proxy__/stats``: JSON ``{"requests", "gets", "body_bytes", "head_bytes"}`` since
  the last reset (``body_bytes``: response bodies sent to clients, the traffic a reader costs);
- ``GET /__proxy__/reset``: zero the counters.

Only what the S3 clients here send is understood: a request with a ``Content-Length`` body (or
none), a response with ``Content-Length``, ``Transfer-Encoding: chunked`` or a body up to close.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import sys
import threading
import time
from urllib.parse import urlsplit

CHUNK = 64 << 10  # bytes relayed (and paced) at once
STATS = b"/__proxy__/stats"
RESET = b"/__proxy__/reset"


class Link:
    """The shared pipe: a token bucket every response byte goes through, and the counters."""

    def __init__(self, latency: float, bandwidth: float) -> None:
        self.latency = latency
        self.rate = bandwidth  # bytes per second; 0: unlimited
        self.lock = threading.Lock()
        self.next_free = time.monotonic()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.requests = self.gets = self.body_bytes = self.head_bytes = 0

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {
                "requests": self.requests,
                "gets": self.gets,
                "body_bytes": self.body_bytes,
                "head_bytes": self.head_bytes,
            }

    def count(self, method: bytes) -> None:
        with self.lock:
            self.requests += 1
            self.gets += method == b"GET"

    def send(self, sock: socket.socket, data: bytes, body: bool) -> None:
        """Send ``data`` once the link has room for it (bytes leave at ``rate`` in all)."""
        with self.lock:
            if body:
                self.body_bytes += len(data)
            else:
                self.head_bytes += len(data)
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + (len(data) / self.rate if self.rate else 0.0)
            wait = self.next_free - now
        if wait > 0:
            time.sleep(wait)
        sock.sendall(data)


class Stream:
    """A socket read through a buffer: whole lines, exact lengths, or all until close."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def head(self) -> bytes:
        """Everything up to and including the blank line ending a head (b"" at close)."""
        while b"\r\n\r\n" not in self.buf:
            more = self.sock.recv(CHUNK)
            if not more:
                return b""
            self.buf += more
        end = self.buf.index(b"\r\n\r\n") + 4
        got, self.buf = self.buf[:end], self.buf[end:]
        return got

    def some(self, limit: int) -> bytes:
        """Up to ``limit`` bytes (b"" at close)."""
        if not self.buf:
            self.buf = self.sock.recv(min(limit, CHUNK))
        got, self.buf = self.buf[:limit], self.buf[limit:]
        return got

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            more = self.sock.recv(CHUNK)
            if not more:
                raise ConnectionError("closed inside a chunked body")
            self.buf += more
        end = self.buf.index(b"\r\n") + 2
        got, self.buf = self.buf[:end], self.buf[end:]
        return got


def header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip()
    return None


def relay_body(src: Stream, dst: socket.socket, length: int | None, link: Link | None) -> None:
    """Copy a body of ``length`` bytes (None: until close) from ``src`` to ``dst``."""
    left = length
    while left is None or left > 0:
        block = src.some(CHUNK if left is None else min(CHUNK, left))
        if not block:
            if left is None:
                return
            raise ConnectionError(f"closed with {left} body bytes to go")
        if link is None:
            dst.sendall(block)
        else:
            link.send(dst, block, body=True)
        if left is not None:
            left -= len(block)


def relay_chunked(src: Stream, dst: socket.socket, link: Link) -> None:
    while True:
        size_line = src.line()
        size = int(size_line.split(b";")[0], 16)
        link.send(dst, size_line, body=False)
        if size == 0:
            while (trailer := src.line()) != b"\r\n":
                link.send(dst, trailer, body=False)
            link.send(dst, b"\r\n", body=False)
            return
        relay_body(src, dst, size, link)
        link.send(dst, src.line(), body=False)


def answer_own(client: socket.socket, link: Link, path: bytes) -> None:
    if path.startswith(RESET):
        link.reset()
    body = json.dumps(link.stats()).encode()
    client.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


class Handler(socketserver.BaseRequestHandler):
    """One client connection: its requests in turn, over one upstream connection."""

    server: Server

    def handle(self) -> None:
        client = Stream(self.request)
        upstream: Stream | None = None
        try:
            while head := client.head():
                method, path = head.split(b" ", 2)[:2]
                length = int(header(head, b"content-length") or 0)
                if path.startswith(b"/__proxy__/"):
                    answer_own(self.request, self.server.link, path)
                    continue
                body = client.some(length) if length else b""
                while len(body) < length:
                    more = client.some(length - len(body))
                    if not more:
                        return
                    body += more
                if self.server.log:
                    line = head.split(b"\r\n", 1)[0].decode()
                    print(f"{time.monotonic():.3f} {line}", file=sys.stderr, flush=True)
                time.sleep(self.server.link.latency)
                self.server.link.count(method)
                if upstream is None:
                    upstream = Stream(socket.create_connection(self.server.upstream))
                upstream.sock.sendall(head + body)
                if not self.respond(upstream, method):
                    return
                if header(head, b"connection") == b"close":
                    return
        except (ConnectionError, OSError):
            return
        finally:
            if upstream is not None:
                upstream.sock.close()

    def respond(self, upstream: Stream, method: bytes) -> bool:
        """Relay one response; False when the connection is to close after it."""
        link = self.server.link
        head = upstream.head()
        if not head:
            return False
        link.send(self.request, head, body=False)
        status = int(head.split(b" ", 2)[1])
        te = header(head, b"transfer-encoding")
        cl = header(head, b"content-length")
        if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
            pass
        elif te is not None and b"chunked" in te.lower():
            relay_chunked(upstream, self.request, link)
        else:
            relay_body(upstream, self.request, None if cl is None else int(cl), link)
            if cl is None:
                return False
        return header(head, b"connection") != b"close"


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, port: int, upstream: tuple[str, int], link: Link) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.upstream = upstream
        self.link = link
        self.log = False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--upstream", required=True, help="the S3 server, http://host:port")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=20.0)
    p.add_argument("--bandwidth-mbps", type=float, default=100.0, help="MB/s (1e6), 0: none")
    p.add_argument("--log", action="store_true", help="each request's line on stderr")
    return p.parse_args(argv)


def main(args: argparse.Namespace) -> int:
    parts = urlsplit(args.upstream)
    upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
    link = Link(args.latency_ms / 1000.0, args.bandwidth_mbps * 1e6)
    with Server(args.port, upstream, link) as server:
        server.log = args.log
        print(f"READY {server.server_address[1]}", flush=True)
        server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
