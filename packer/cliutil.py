"""What every packer command shares: context settings and turning PackerError into a message."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from packer.errors import PackerError

__all__ = ["CONTEXT", "failure", "friendly"]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def failure(exc: BaseException) -> dict[str, Any]:
    """The one JSON object a ``--json`` command prints on stdout when it fails."""
    message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
    return {"ok": False, "error": message, "type": type(exc).__name__}


def friendly(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a PackerError into a one-line message and exit status 1; Ctrl-C into status 130.

    A command run with the ``--json`` flag (its ``as_json`` parameter true) also prints the
    failure as one JSON object on stdout (:func:`failure`), so a script always has something
    to parse; the message still goes to stderr for a human.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (PackerError, click.ClickException) as exc:
            if kwargs.get("as_json") is True:
                click.echo(json.dumps(failure(exc)))
            if isinstance(exc, click.ClickException):
                raise
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper
