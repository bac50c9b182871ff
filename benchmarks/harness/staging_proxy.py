"""The loopback link of ``benchmarks/staging_stream.py``: :mod:`harness.remote_proxy` with the
upload direction capped too.

``remote_proxy`` holds every request ``--latency-ms`` and paces *response* bytes through its
token bucket, but it reads a request's body whole and forwards it at once: a PUT's bytes are
neither paced nor counted, so an upload through it is limited by the latency and the server
only. This proxy relays each request body to the server as it arrives, through a second token
bucket of the same rate (the link's upstream direction: a real link's two directions do not
share their bandwidth), and counts those bytes. A request announcing ``Expect: 100-continue``
is answered ``100 Continue`` by the proxy itself and forwarded without the header.

``GET /__proxy__/stats`` adds ``"sent_bytes"`` (request bodies relayed) and ``"puts"``; the
rest is ``remote_proxy``'s. Run as ``python staging_proxy.py --upstream URL ...`` (the same
options); it prints ``READY <port>``.
"""

from __future__ import annotations

import json
import sys
import time
from urllib.parse import urlsplit

import remote_proxy as rp


class Link(rp.Link):
    """``remote_proxy``'s link, with an upload bucket of the same rate and its counters."""

    def __init__(self, latency: float, bandwidth: float) -> None:
        self.up = rp.Link(0.0, bandwidth)
        super().__init__(latency, bandwidth)

    def reset(self) -> None:
        super().reset()
        self.up.reset()
        self.puts = 0

    def stats(self) -> dict[str, int]:
        out = super().stats()
        with self.up.lock:
            out["sent_bytes"], out["puts"] = self.up.body_bytes, self.puts
        return out

    def count(self, method: bytes) -> None:
        super().count(method)
        with self.lock:
            self.puts += method == b"PUT"


def own_answer(client: rp.socket.socket, link: Link, path: bytes) -> None:
    if path.startswith(rp.RESET):
        link.reset()
    body = json.dumps(link.stats()).encode()
    client.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def without_expect(head: bytes) -> tuple[bytes, bool]:
    """``head`` without an ``Expect: 100-continue`` line, and whether it had one."""
    lines = head.split(b"\r\n")
    kept = [ln for ln in lines if not ln.lower().startswith(b"expect:")]
    return b"\r\n".join(kept), len(kept) != len(lines)


class Handler(rp.Handler):
    """One client connection: each request held ``latency``, its body relayed upstream at the
    upload rate as it arrives, the response relayed at the download rate."""

    server: Server

    def handle(self) -> None:
        client = rp.Stream(self.request)
        upstream: rp.Stream | None = None
        link = self.server.link
        try:
            while head := client.head():
                method, path = head.split(b" ", 2)[:2]
                if path.startswith(b"/__proxy__/"):
                    own_answer(self.request, link, path)
                    continue
                if rp.header(head, b"transfer-encoding") is not None:
                    raise ConnectionError("chunked request bodies are not relayed")
                length = int(rp.header(head, b"content-length") or 0)
                head, expect = without_expect(head)
                time.sleep(link.latency)
                link.count(method)
                if upstream is None:
                    upstream = rp.Stream(rp.socket.create_connection(self.server.upstream))
                upstream.sock.sendall(head)
                if expect:
                    self.request.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                if length:
                    rp.relay_body(client, upstream.sock, length, link.up)
                if not self.respond(upstream, method):
                    return
                if rp.header(head, b"connection") == b"close":
                    return
        except (ConnectionError, OSError):
            return
        finally:
            if upstream is not None:
                upstream.sock.close()


class Server(rp.Server):
    link: Link

    def __init__(self, port: int, upstream: tuple[str, int], link: Link) -> None:
        rp.socketserver.ThreadingTCPServer.__init__(self, ("127.0.0.1", port), Handler)
        self.upstream = upstream
        self.link = link
        self.log = False


def main(argv: list[str] | None = None) -> int:
    args = rp.parse_args(argv)
    parts = urlsplit(args.upstream)
    upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
    link = Link(args.latency_ms / 1000.0, args.bandwidth_mbps * 1e6)
    with Server(args.port, upstream, link) as server:
        print(f"READY {server.server_address[1]}", flush=True)
        server.serve_forever(poll_interval=0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
