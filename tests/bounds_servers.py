"""Real servers on the loopback for the round-4 bounds tests (issue 40, items 5, 6, 9, 10):

- :class:`StopReading`: a TCP relay in front of a real upstream (moto) that, for a request whose
  first line contains ``match`` (``stalls`` times, -1: always), forwards its first ``keep`` bytes
  and then never reads from that connection again (a store that stops reading a PUT's body
  mid-way); its receive buffer is small, so the client's writes block soon. ``stalled`` counts
  the stalled requests. A stalled connection is closed after ``hold`` seconds (a hang guard:
  a client that never gives up fails then, never hangs the suite).
- :class:`FileServer`: a plain HTTP/1.1 server of a folder with Range requests, HEAD, ETag, and
  faults per request: ``fail(pattern, [status, ...])`` answers the next requests whose
  ``METHOD path`` (`` Range=bytes=A-B`` after it for a ranged GET) ``pattern`` searches (a
  regular expression) with those statuses (``"stall"``: read, never answered);
  ``always(pattern, status)`` every one. ``seen`` logs ``METHOD path -> answer``.

Every connection ends by itself at ``close()``; the threads are daemons.
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_REQUEST = re.compile(rb"^[A-Z]+ \S+ HTTP/1\.[01]\r\n")


class StopReading:
    """The running relay: ``endpoint`` to give the client; ``match``/``stalls`` to stall."""

    def __init__(self, upstream: str, keep: int = 64 << 10, hold: float = 60.0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.match, self.stalls, self.keep, self.hold = "", 0, keep, hold
        self.stalled = 0
        self.requests: list[str] = []
        self.closed = threading.Event()
        self.lock = threading.Lock()
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 10)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def serve(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()

    def _stall_now(self, line: str) -> bool:
        with self.lock:
            if not self.match or self.match not in line or self.stalls == 0:
                return False
            self.stalls -= self.stalls > 0
            self.stalled += 1
            return True

    def _connection(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        for sock in (client, upstream):
            sock.settimeout(0.2)
        threading.Thread(target=self._back, args=(upstream, client), daemon=True).start()
        try:
            while not self.closed.is_set():
                try:
                    data = client.recv(16 << 10)
                except TimeoutError:
                    continue
                if not data:
                    break
                if _REQUEST.match(data):
                    line = data.split(b"\r\n", 1)[0].decode("latin-1")
                    self.requests.append(line)
                    if self._stall_now(line):
                        upstream.sendall(data[: self.keep])  # the headers, a piece of the body
                        self.closed.wait(self.hold)  # no other read: the client's writes block
                        break
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                sock.close()

    def _back(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while not self.closed.is_set():
                try:
                    data = upstream.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                client.sendall(data)
        except OSError:
            pass


@contextmanager
def stop_reading(upstream: str) -> Iterator[StopReading]:
    relay = StopReading(upstream)
    thread = threading.Thread(target=relay.serve, daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.close()
        thread.join(5)


class FileServer:
    """A running server of ``root``: ``endpoint``, ``fail``/``always`` to inject faults."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.once: list[tuple[str, str]] = []  # (pattern, answer), consumed in order
        self.forever: dict[str, str] = {}
        self.seen: list[str] = []
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def fail(self, pattern: str, answers: list[str]) -> None:
        with self.lock:
            self.once += [(pattern, answer) for answer in answers]

    def always(self, pattern: str, answer: str) -> None:
        with self.lock:
            self.forever[pattern] = answer

    def answer(self, request: str) -> str:
        with self.lock:
            for k, (pattern, answer) in enumerate(self.once):
                if re.search(pattern, request):
                    del self.once[k]
                    return answer
            for pattern, answer in self.forever.items():
                if re.search(pattern, request):
                    return answer
        return "ok"


def _handler(served: FileServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            ranged = self.headers.get("Range")
            request = f"{self.command} {self.path}" + (f" Range={ranged}" if ranged else "")
            answer = served.answer(request)
            with served.lock:
                served.seen.append(f"{request} -> {answer}")
            if answer == "stall":
                served.closed.wait()
                self.close_connection = True
                return
            if answer != "ok":
                self._status(int(answer))
                return
            path = served.root / unquote(urlsplit(self.path).path).lstrip("/")
            if not path.is_file():
                self._status(404)
                return
            data = path.read_bytes()
            tag = '"' + hashlib.md5(data).hexdigest() + '"'  # noqa: S324 - an ETag
            start, stop, status = 0, len(data), 200
            found = re.match(r"bytes=(\d+)-(\d*)$", ranged or "")
            if found:
                start = int(found.group(1))
                stop = min(len(data), int(found.group(2)) + 1 if found.group(2) else len(data))
                status = 206
            self.send_response(status)
            self.send_header("Content-Length", str(stop - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", tag)
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{len(data)}")
            self.end_headers()
            if body:
                self.wfile.write(data[start:stop])

        def _status(self, status: int) -> None:
            text = f"status {status}".encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(text)

    return Handler


@contextmanager
def file_server(root: Path) -> Iterator[FileServer]:
    served = FileServer(root)
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        served.closed.set()
        served.server.shutdown()
        served.server.server_close()
        thread.join(5)
        time.sleep(0)
