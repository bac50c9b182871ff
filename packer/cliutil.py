"""What every packer command shares: context settings and turning PackerError into a message."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import click

from packer.errors import PackerError

__all__ = ["CONTEXT", "friendly"]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def friendly(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a PackerError into a one-line message and exit status 1; Ctrl-C into status 130."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except PackerError as exc:
            raise click.ClickException(str(exc)) from exc
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)

    return wrapper
