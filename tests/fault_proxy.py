"""A fault-injecting HTTP proxy on the loopback for the remote tests: a real threaded server
between the s3fs client and the moto server that forwards every request, except that the next
requests matching a pattern get the faults of a schedule:

- ``"503"``, ``"429"``, ``"403"``: answered at once with that status (an S3 XML error body);
- ``"drop"``: the server's headers and half its body are sent, then the connection is closed;
- ``"short"``: the headers say half the body's length and only that half is sent (a body
  truncated on the way, well formed to the client);
- ``"flip"``: the whole body, one byte in its middle flipped (corrupted on the way);
- ``"slow"``: the whole answer, after :data:`SLOW` seconds (a download in progress);
- ``"held"``: the whole answer, once the test calls ``let_held_go()`` (:data:`HANG` s at most):
  a download in progress for as long as the test needs, ``holding`` counting the answers held
  now;
- ``"stall"``: the headers and half the body, then nothing until ``release()`` (or
  :data:`HANG` s), then the connection is closed (a client killed mid-download);
- a bad answer to a ranged GET: ``"whole"`` (200 and the whole object: the Range ignored),
  ``"longer"`` (206 with 10 bytes more than asked), ``"badrange"`` (206 whose Content-Range
  names another start).

``delay`` (seconds) holds every forwarded request that long first: a store far away.

A pattern is matched against ``METHOD path``, followed by `` Range=bytes=A-B;`` for a ranged
request (so a test can single out a whole-object download). ``sent`` logs the body bytes of each
answer: ``(METHOD path, Range header or None, bytes)``. ``wait_until(test)`` waits for the
proxy's state (a fault taken, an answer held or stalled) on an event, not a clock.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_CODES = {
    "503": ("ServiceUnavailable", "Service Unavailable"),
    "429": ("SlowDown", "Too Many Requests"),
    "403": ("AccessDenied", "Access Denied"),
}


SLOW = 2.0  # seconds a "slow" answer waits
# A hang guard: the most a held or stalled answer, or a wait_until, waits; only a test that
# never lets go (a failed one) reaches it, never a slow machine
HANG = 300.0


class FaultProxy:
    """The running proxy: ``endpoint`` to give the client, ``inject`` to schedule faults."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.faults: list[str] = []
        self.match = ""
        self.delay = 0.0  # seconds each forwarded request waits before it is forwarded
        self.in_flight = self.most_in_flight = 0  # requests being served now, and at most
        self.served: list[str] = []  # "METHOD path -> fault or status", in order
        self.sent: list[tuple[str, str | None, int]] = []  # (METHOD path, Range, body bytes)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)  # a fault taken, an answer sent or held
        self.stalling = 0  # "stall" answers cut and waiting for release() now
        self.released = threading.Event()
        self.unheld = threading.Event()
        self.holding = 0  # "held" answers waiting for let_held_go() now
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def inject(self, faults: list[str], match: str = "") -> None:
        """The next ``len(faults)`` requests whose ``METHOD path`` contains ``match`` get them."""
        with self.lock:
            self.faults, self.match = list(faults), match
            if "held" in faults:
                self.unheld.clear()

    def let_held_go(self) -> None:
        """Answer every ``"held"`` request now (the next ``inject`` of ``"held"`` holds again)."""
        self.unheld.set()

    def release(self) -> None:
        """End every stalled response now."""
        self.released.set()

    def next_fault(self, request: str) -> str | None:
        with self.lock:
            if self.faults and self.match in request:
                self.changed.notify_all()
                return self.faults.pop(0)
        return None

    def wait_until(self, test: Callable[[], bool], timeout: float = HANG) -> None:
        """Wait until ``test()`` holds, woken at each change of the proxy's state (a fault
        taken, an answer sent, held, let go or stalled); a test still false after ``timeout`` s (a
        hang guard, no bound on a slow machine) fails the test."""
        with self.changed:
            assert self.changed.wait_for(test, timeout), f"still not so after {timeout:.0f} s"


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms stall

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            request = f"{self.command} {self.path}"
            ranged = self.headers.get("Range")
            fault = proxy.next_fault(request + (f" Range={ranged};" if ranged else ""))
            proxy.served.append(f"{request} -> {fault or 'forwarded'}")
            if fault in _CODES:
                return self._status(int(fault), *_CODES[fault])
            with proxy.lock:
                proxy.in_flight += 1
                proxy.most_in_flight = max(proxy.most_in_flight, proxy.in_flight)
            time.sleep(proxy.delay)
            with proxy.lock:
                proxy.in_flight -= 1
            if fault == "slow":
                time.sleep(SLOW)
            if fault == "held":
                with proxy.lock:
                    proxy.holding += 1
                    proxy.changed.notify_all()
                proxy.unheld.wait(HANG)
                with proxy.lock:
                    proxy.holding -= 1
                    proxy.changed.notify_all()
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            if fault == "whole" and ranged:
                headers = {k: v for k, v in headers.items() if k.lower() != "range"}
            if fault == "longer" and ranged:
                first, last = ranged.split("=", 1)[1].split("-")
                headers = {k: v for k, v in headers.items() if k.lower() != "range"}
                headers["Range"] = f"bytes={first}-{int(last) + 10}"
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            conn.close()
            cut = (
                len(data) // 2
                if fault in ("drop", "short", "stall") and len(data) > 1
                else len(data)
            )
            if fault == "flip" and data:
                data = (
                    data[: len(data) // 2]
                    + bytes([data[len(data) // 2] ^ 0x10])
                    + data[len(data) // 2 + 1 :]
                )
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if fault == "badrange" and key.lower() == "content-range":
                    first, rest = value.split(" ", 1)[1].split("-", 1)
                    last, total = rest.split("/")
                    shift = 1 if int(first) == 0 else -1
                    value = f"bytes {int(first) + shift}-{int(last) + shift}/{total}"
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            size = answer.getheader("Content-Length", "0") if self.command == "HEAD" else len(data)
            self.send_header("Content-Length", str(cut if fault == "short" else size))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data[:cut])
                with proxy.lock:
                    proxy.sent.append((request, ranged, cut))
                    proxy.changed.notify_all()
            if fault == "stall":
                self.wfile.flush()
                with proxy.lock:
                    proxy.stalling += 1
                    proxy.changed.notify_all()
                proxy.released.wait(HANG)
                with proxy.lock:
                    proxy.stalling -= 1
            if fault in ("drop", "stall"):
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)

        def _status(self, status: int, code: str, text: str) -> None:
            body = f"<Error><Code>{code}</Code><Message>{text}</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    """Run a :class:`FaultProxy` in front of ``upstream`` (``http://host:port``)."""
    proxy = FaultProxy(upstream)
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()
