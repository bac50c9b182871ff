"""What every packer command shares: context settings, the option kinds the commands repeat,
and turning errors into one-line messages."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from packer.errors import PackerError

__all__ = [
    "CONTEXT",
    "INTERNAL_ERROR",
    "DatasetPath",
    "batch_size_option",
    "failure",
    "flag",
    "friendly",
    "json_flag",
    "positive_int",
    "quiet_flag",
    "safe_output",
    "size_option",
    "storage_option",
]

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
INTERNAL_ERROR = 2  # the exit status of a bug: not 1, so a test expecting a refusal catches it
_CLICK = (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort)
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def flag(*names: str, text: str) -> Decorator:
    """An on/off switch (``--overwrite``): False unless given."""
    return click.option(*names, is_flag=True, help=text)


def json_flag(text: str) -> Decorator:
    """``--json``: print one JSON object instead of text (the parameter is ``as_json``)."""
    return flag("--json", "as_json", text=text)


def quiet_flag(text: str = "No progress bar.") -> Decorator:
    """``-q/--quiet``: no progress bar."""
    return flag("-q", "--quiet", text=text)


def positive_int(*names: str, text: str | None = None, **extra: Any) -> Decorator:
    """An integer option of at least 1 (``--workers``, ``--max-side``); ``extra`` as click's."""
    return click.option(*names, type=click.IntRange(min=1), help=text, **extra)


def batch_size_option() -> Decorator:
    """``--batch-size`` of a DataLoader run, 64 by default."""
    return positive_int("--batch-size", default=64, show_default=True)


def size_option(name: str, default: str, text: str) -> Decorator:
    """A byte size given as text (``16MB``, ``512MiB``; parsed by packer.core.sizes), with a default."""
    return click.option(name, default=default, show_default=True, help=text)


class DatasetPath(click.ParamType):
    """A dataset argument: a URL (``s3://...``, ``https://...``; kept as text) or a local path
    that must exist (a ``Path``; a ``file:`` URL names one)."""

    name = "PATH|URL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from packer.errors import PackerError
        from packer.remote.local import file_path, is_file_url
        from packer.remote.storage import is_url

        if is_url(value):
            return str(value)
        if is_file_url(value):  # file:///x is the local /x
            try:
                value = file_path(str(value))
            except PackerError as exc:
                self.fail(str(exc), param, ctx)
        path = click.Path(exists=True, path_type=Path)
        return path.convert(value, param, ctx)


def _storage_options(ctx: click.Context, param: click.Parameter, values: Any) -> dict[str, Any]:
    """``KEY=VALUE`` pairs as a dict, each value parsed as JSON when it parses, else text."""
    options: dict[str, Any] = {}
    for pair in values or ():
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (e.g. endpoint_url=http://...)")
        try:
            options[key] = json.loads(text)
        except ValueError:
            options[key] = text
    return options


def storage_option() -> Decorator:
    """``--storage-option KEY=VALUE`` (repeatable): fsspec options for a URL dataset, the
    parameter ``storage_options`` a dict (values parsed as JSON when they parse)."""
    return click.option(
        "--storage-option",
        "storage_options",
        multiple=True,
        metavar="KEY=VALUE",
        callback=_storage_options,
        help="fsspec option for a URL dataset (e.g. endpoint_url=http://host:9000); repeatable.",
    )


def safe_output() -> None:
    """Let stdout and stderr print any name: a file name that is not UTF-8 (held as lone
    surrogates) prints with backslash escapes instead of failing with UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


_OPTION = re.compile(
    r"""storage_options=\{\s*['"](\w+)['"]\s*:\s*['"]?([^,'"}]*)['"]?(?:,\s*\.\.\.)?\s*\}"""
)


def cli_words(message: str) -> str:
    """A library message in the CLI's words: ``storage_options={'endpoint_url': ...}`` is
    ``--storage-option endpoint_url=...``, a bare ``storage_options`` is ``--storage-option``,
    ``cache_dir=`` is ``--cache-dir``."""
    message = _OPTION.sub(lambda m: f"--storage-option {m.group(1)}={m.group(2)}", message)
    message = re.sub(r"\bstorage_options\b(?!=)", "--storage-option", message)
    return re.sub(r"\bcache_dir=\s?", "--cache-dir ", message)


def failure(exc: BaseException) -> dict[str, Any]:
    """The one JSON object a ``--json`` command prints on stdout when it fails."""
    message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
    return {"ok": False, "error": cli_words(message), "type": type(exc).__name__}


def friendly(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a PackerError into a one-line message and exit status 1; Ctrl-C into status 130.

    A command run with the ``--json`` flag (its ``as_json`` parameter true) also prints the
    failure as one JSON object on stdout (:func:`failure`), so a script always has something
    to parse; the message still goes to stderr for a human.

    Any other exception is a packer bug (every expected failure is a PackerError): it prints one
    line, ``internal error: <type>: <message> (please report it ...)``, and exits with status 2
    instead of a traceback; with ``PACKER_DEBUG=1`` in the environment the traceback is shown.
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
            raise click.ClickException(cli_words(str(exc))) from exc
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except _CLICK:
            raise
        except Exception as exc:
            if os.environ.get("PACKER_DEBUG"):
                raise
            message = " ".join(str(exc).split())
            click.echo(
                f"internal error: {type(exc).__name__}: {message} (please report it; "
                "PACKER_DEBUG=1 shows the traceback)",
                err=True,
            )
            sys.exit(INTERNAL_ERROR)

    return wrapper
