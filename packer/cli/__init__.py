"""The ``packer`` command line: parse, call one library function, echo (``packer.cli.app``)."""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # `packer.cli:main`, the console script of installs made before the move to sub-packages
    if name == "main":
        from packer.cli.app import main

        return main
    raise AttributeError(f"module 'packer.cli' has no attribute {name!r}")
