"""Run one measurement in a freshly forked child, so nothing one pass leaves behind reaches the next."""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["in_child"]


def in_child(function: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``function(*args)`` (a JSON-able dict) computed in a forked child process.

    Every pass starts from the same parent state: no allocator setting (packer's readers may
    call ``mallopt``), heap layout, open environment or handle cache left by an earlier pass.
    """
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never return into the caller's code
        code = 1
        try:
            os.close(read_end)
            try:
                payload: dict[str, Any] = {"ok": function(*args)}
            except BaseException:
                payload = {"error": traceback.format_exc()}
            data = json.dumps(payload).encode()
            while data:
                data = data[os.write(write_end, data) :]
            code = 0
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"benchmark child {pid} died (wait status {status})")
    payload = json.loads(data)
    if "error" in payload:
        raise RuntimeError(f"benchmark pass failed in child {pid}:\n{payload['error']}")
    result: dict[str, Any] = payload["ok"]
    return result
