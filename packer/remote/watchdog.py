"""The progress watchdog of every request packer sends through an aiohttp client (s3fs and
fsspec's HTTP: metadata, ranged GETs of the fsspec backend, cache downloads, uploads).

A client's sockets are made here (aiohttp's ``socket_factory``), so each counts the bytes it
moves both ways. A thread of the process looks at them every ``read_timeout / 10`` seconds (at
most 1 s): a socket busy at every look of the last ``read_timeout`` seconds — a write waiting
for the store to take bytes, or bytes arriving — that moved fewer than ``min_rate`` bytes a
second over them (none: a store that stopped reading a PUT's body) is cut. Its next send or
receive raises :class:`Stalled` (an ``OSError``, ETIMEDOUT, naming the bound), which the client
reports as a connection error: a passing failure, tried again by packer's retry. So an attempt
ends ``read_timeout`` seconds after it stops making progress, whatever its size, where the
per-attempt deadline (``connect + read + bytes / min_rate``) is the last resort only.

A wait for the store's first answer byte is aiohttp's and botocore's ``read_timeout`` (the
socket is idle then, not busy).
"""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = ["CUT", "Stalled", "cut_reason", "cuts", "socket_factory", "watched_options"]

_TICKS = 10  # looks per read_timeout window
_LOCK = threading.Lock()
_SOCKETS: weakref.WeakSet[_Watched] = weakref.WeakSet()
_THREAD: list[tuple[int, threading.Thread]] = []  # (pid, the watchdog thread of that process)
_CUTS: list[str] = []  # why each cut socket was cut, in order (this process)


class Stalled(TimeoutError):
    """A request the watchdog cut: no progress, or below ``min_rate``, for ``read_timeout`` s
    (its text starts with :data:`CUT`; a client wraps it, :func:`cut_reason` finds it)."""


CUT = "packer's watchdog cut the connection"


def cut_reason(exc: BaseException | None) -> str | None:
    """The watchdog's reason in ``exc`` or what it was raised from (a client's wrapping of
    :class:`Stalled`: aiohttp's ``ClientOSError``, botocore's ``EndpointConnectionError``)."""
    seen: list[BaseException] = []
    while exc is not None and len(seen) < 16 and exc not in seen:
        seen.append(exc)
        text = str(exc)
        if CUT in text:
            return text[text.index(CUT) :]
        more = getattr(exc, "kwargs", None)  # botocore keeps the wrapped error there
        error = more.get("error") if isinstance(more, dict) else None
        exc = error if isinstance(error, BaseException) else exc.__cause__ or exc.__context__
    return None


def cuts() -> list[str]:
    """Why each socket this process's watchdog cut was cut (oldest first)."""
    with _LOCK:
        return list(_CUTS)


class _Watched(socket.socket):
    """A socket counting the bytes it moves; once cut, every send or receive raises."""

    def setup(self, read_timeout: float, min_rate: float) -> None:
        self.window, self.min_rate = read_timeout, min_rate
        self.moved, self.waiting, self.cut_why = 0, False, ""
        self.samples: deque[tuple[float, int]] = deque()  # (time, moved) at each look
        self.busy_since: float | None = None
        self.seen = 0

    def _check(self) -> None:
        if self.cut_why:
            raise Stalled(self.cut_why)

    def _sending(self, send: Callable[[], int], size: Callable[[], int]) -> int:
        """``send()``'s bytes counted; the socket waits for the store while a send does not
        take all ``size()`` bytes (or would block)."""
        self._check()
        try:
            sent = send()
        except BlockingIOError:
            self.waiting = True
            raise
        self.moved += sent
        self.waiting = sent < size()
        return sent

    def send(self, data: Any, *flags: Any) -> int:
        return self._sending(
            functools.partial(super().send, data, *flags), lambda: memoryview(data).nbytes
        )

    def sendmsg(self, buffers: Any, *more: Any) -> int:
        return self._sending(
            functools.partial(super().sendmsg, buffers, *more),
            lambda: sum(memoryview(b).nbytes for b in buffers),
        )

    def recv(self, size: int, *flags: Any) -> bytes:
        self._check()
        data = super().recv(size, *flags)
        self.moved += len(data)
        return data

    def recv_into(self, buffer: Any, *more: Any) -> int:
        self._check()
        got = super().recv_into(buffer, *more)
        self.moved += got
        return got

    def look(self, now: float) -> None:
        """One look of the watchdog: record the progress, cut a socket stalled or too slow."""
        busy = self.moved > self.seen or self.waiting
        self.seen = self.moved
        if not busy:
            self.busy_since = None
        elif self.busy_since is None:
            self.busy_since = now
        self.samples.append((now, self.moved))
        while len(self.samples) > 1 and self.samples[1][0] <= now - self.window:
            self.samples.popleft()
        if self.busy_since is None or now - self.busy_since < self.window or self.cut_why:
            return
        since, before = self.samples[0]
        if now - since < self.window:
            return
        rate = (self.moved - before) / (now - since)
        if rate >= self.min_rate:
            return
        if self.moved == before:
            why = f"no byte moved for {now - since:.1f}s (read_timeout={self.window:g}s)"
            why += ": the store stopped reading the request" if self.waiting else ""
        else:
            why = (
                f"{rate:.0f} bytes/s over {now - since:.1f}s, below min_rate={self.min_rate:g} "
                f"(read_timeout={self.window:g}s window)"
            )
        self.cut(f"{CUT}: {why}")

    def cut(self, why: str) -> None:
        self.cut_why = why
        with _LOCK:
            _CUTS.append(why)
        try:
            super().shutdown(socket.SHUT_RDWR)  # wakes the client's loop: its next call raises
        except OSError:
            pass


def _watch() -> None:
    """The watchdog thread: looks at every live socket until none is left."""
    while True:
        with _LOCK:
            live = [s for s in list(_SOCKETS) if s.fileno() >= 0]
            if not live:
                _THREAD.clear()
                return
        now = time.monotonic()
        for sock in live:
            try:
                sock.look(now)
            except Exception:  # noqa: S112 - a socket closed meanwhile
                continue
        time.sleep(min(1.0, max(0.02, min(s.window for s in live) / _TICKS)))


def socket_factory(limits: dict[str, float]) -> Any:
    """aiohttp's ``socket_factory``: sockets the watchdog looks at, bounded by ``limits``."""
    read_timeout, min_rate = float(limits["read_timeout"]), float(limits["min_rate"])

    def make(addr_info: Any) -> socket.socket:
        family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
        sock = _Watched(family, kind, proto)
        sock.setup(read_timeout, min_rate)
        with _LOCK:
            _SOCKETS.add(sock)
            if not _THREAD or _THREAD[0][0] != os.getpid() or not _THREAD[0][1].is_alive():
                thread = threading.Thread(target=_watch, name="packer-watchdog", daemon=True)
                _THREAD[:] = [(os.getpid(), thread)]
                thread.start()
        return sock

    return make


def watched_options(protocol: str, options: dict[str, Any], limits: dict[str, float]) -> Any:
    """fsspec ``options`` (as :func:`packer.remote.obstore_backend.fsspec_options` gives them)
    whose client makes its sockets here: s3fs through aiobotocore's ``connector_args``, HTTP
    through a ``get_client`` building its own connector; a connector or factory the user set is
    kept (unwatched)."""
    factory = socket_factory(limits)
    if protocol in ("s3", "s3a"):
        config = dict(options.get("config_kwargs") or {})
        connector = dict(config.get("connector_args") or {})
        connector.setdefault("socket_factory", factory)
        return {**options, "config_kwargs": {**config, "connector_args": connector}}
    if protocol in ("http", "https") and "get_client" not in options:
        if "connector" in (options.get("client_kwargs") or {}):
            return options

        async def get_client(**kwargs: Any) -> Any:
            import aiohttp

            kwargs.pop("loop", None)
            return aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(socket_factory=factory), **kwargs
            )

        return {**options, "get_client": get_client}
    return options


def _forget_in_child() -> None:
    global _LOCK
    _LOCK = threading.Lock()  # the watchdog thread may have held it at the fork
    _SOCKETS.clear()  # the parent's clients are rebuilt after a fork (RemoteFolder.fs)
    _THREAD.clear()


os.register_at_fork(after_in_child=_forget_in_child)
