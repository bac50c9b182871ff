"""A stalling TCP relay on the loopback for the timeout tests: a real socket server between a
client and a real upstream (the moto server) that relays bytes both ways, except that a request
whose first line contains ``match`` (while ``mode`` is not ``"pass"``) is stalled:

- ``"silent"``: the request is read and never answered (nor forwarded): a store that accepts
  and never answers, or one that never sends ``100 Continue``;
- ``"trickle"``: the request is forwarded and the answer relayed one byte every ``every``
  seconds (a link that is alive but crawls: each wait for a byte is short).

``requests`` logs each request's first line. Every connection ends by itself ``life`` seconds
after the relay started (bounded in time even if a test forgets it), and at ``close()``.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

_REQUEST = re.compile(rb"^[A-Z]+ \S+ HTTP/1\.[01]\r\n")


class StallRelay:
    """The running relay: ``endpoint`` to give the client; ``mode``/``match`` to stall."""

    def __init__(self, upstream: str, life: float = 120.0) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.mode, self.match, self.every = "pass", "", 0.05
        self.requests: list[str] = []
        self.end = time.monotonic() + life
        self.closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def alive(self) -> bool:
        return not self.closed.is_set() and time.monotonic() < self.end

    def serve(self) -> None:
        while self.alive():
            try:
                client, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        self.listener.close()

    def _connection(self, client: socket.socket) -> None:
        state = {"stall": ""}  # the mode of the request being answered
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            client.close()
            return
        for sock in (client, upstream):
            sock.settimeout(0.2)
        back = threading.Thread(target=self._answers, args=(upstream, client, state), daemon=True)
        back.start()
        try:
            while self.alive():
                try:
                    data = client.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                if _REQUEST.match(data):
                    line = data.split(b"\r\n", 1)[0].decode("latin-1")
                    self.requests.append(line)
                    hit = self.mode != "pass" and self.match in line
                    state["stall"] = self.mode if hit else ""
                if state["stall"] != "silent":
                    upstream.sendall(data)
        except OSError:
            pass
        finally:  # a silent request's connection was held open, unanswered, until here
            for sock in (client, upstream):
                sock.close()

    def _answers(
        self, upstream: socket.socket, client: socket.socket, state: dict[str, str]
    ) -> None:
        try:
            while self.alive():
                try:
                    data = upstream.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    break
                if state["stall"] == "trickle":
                    for k in range(len(data)):
                        if not self.alive():
                            return
                        client.sendall(data[k : k + 1])
                        time.sleep(self.every)
                elif state["stall"] != "silent":
                    client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()


@contextmanager
def stall_relay(upstream: str, life: float = 120.0) -> Iterator[StallRelay]:
    """Run a :class:`StallRelay` in front of ``upstream`` (``http://host:port``)."""
    relay = StallRelay(upstream, life)
    thread = threading.Thread(target=relay.serve, daemon=True)
    thread.start()
    try:
        yield relay
    finally:
        relay.close()
        thread.join(5)
