"""``packer pack MODULE:FUNCTION INPUTS DST``: :func:`packer.pack` from a shell or a SLURM script.

FUNCTION is found as ``python -m`` finds a module (the current folder first) or in a ``.py``
file named by its path. INPUTS is a text file with one input per line (blank lines ignored) or a
folder, whose files (at any depth, sorted by path, hidden ones left out) are the inputs, each
as its path.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from packer.cli.util import CONTEXT, friendly, json_flag, positive_int, quiet_flag, size_option
from packer.errors import PackerError

if TYPE_CHECKING:
    from packer.write.writer_values import Check

__all__ = ["load_function", "pack", "read_inputs"]

# packer.decode.check.CHECKS, the default first, spelled out as convert's --check spells them
# (that module imports Pillow: not at the command line's start; tests/test_pack_check.py
# checks the two agree)
CHECK_CHOICES = ("scan", "fast", "decode")


def _module(name: str) -> Any:
    if name.endswith(".py") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise PackerError(f"{name!r}: no such Python file")
        module_name = path.stem if path.stem.isidentifier() else "packer_user_fn"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise PackerError(f"{name!r} cannot be loaded as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # so workers and pickling find it by name
        spec.loader.exec_module(module)
        return module
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(name)


def load_function(spec: str) -> Callable[[Any], Any]:
    """The function ``MODULE:FUNCTION`` (or ``path/to/file.py:FUNCTION``) names.

    Raises:
        PackerError: a malformed spec, a module that does not import (with its error), or no
            such function in it.
    """
    name, sep, attr = spec.rpartition(":")
    if not sep or not name or not attr:
        raise PackerError(f"{spec!r}: expected MODULE:FUNCTION, e.g. mypackage.prep:to_sample")
    try:
        module = _module(name)
    except PackerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's module: any error it raises is told
        raise PackerError(f"module {name!r} does not import: {type(exc).__name__}: {exc}") from exc
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise PackerError(f"module {name!r} has no {attr!r}")
    if not callable(fn):
        raise PackerError(f"{spec!r} is a {type(fn).__name__}, not a function")
    return fn


def read_inputs(path: Path) -> list[str]:
    """The inputs a text file lists (one a line) or a folder holds (its files' paths).

    Raises:
        PackerError: not a file nor a folder, a text file that is not UTF-8, or no input.
    """
    if path.is_dir():
        found = []
        for folder, dirs, files in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            found += [os.path.join(folder, f) for f in files if not f.startswith(".")]
        inputs = sorted(found)
    elif path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise PackerError(f"{str(path)!r} is not UTF-8 text ({exc})") from None
        inputs = [line.rstrip("\r") for line in text.split("\n") if line.strip()]
    else:
        raise PackerError(f"{str(path)!r}: no such file or folder of inputs")
    if not inputs:
        raise PackerError(f"{str(path)!r} holds no input")
    return inputs


@click.command(context_settings=CONTEXT)
@click.argument("function")
@click.argument("inputs", type=click.Path(exists=True, path_type=Path))
@click.argument("dst", type=click.Path(path_type=Path))
@positive_int("-w", "--workers", text="Processes running FUNCTION (default: the CPUs).")
@click.option("--resume", is_flag=True, help="Continue an interrupted run (same inputs, FUNCTION).")
@click.option("--strict", is_flag=True, help="Stop at the first input FUNCTION fails on.")
@click.option("--overwrite", is_flag=True, help="Replace DST (only once the new one is complete).")
@click.option("--fields", help="Declare the field names up front: jpg,cls (names tuple parts).")
@size_option("--shard-size", "1GiB", "Roll to a new shard past this size; the unit of --resume.")
@positive_int("--jpeg-quality", text="Quality of pixels encoded in a jpg field.", default=90)
@click.option(
    "--check",
    type=click.Choice(CHECK_CHOICES),
    default=CHECK_CHOICES[0],
    show_default=True,
    help="How image bytes FUNCTION returns are checked, as convert --check: scan walks the "
    "whole compressed stream (a 1/8-scale decode), so a corrupt image is skipped now, not met "
    "in training; fast: header + end marker only; decode: a full decode.",
)
@click.option(
    "--part", help="I/N: pack the I-th of N runs of inputs into DST.part-I (packer merge)."
)
@quiet_flag()
@json_flag("Print the summary as one JSON object.")
@friendly
def pack(
    function: str,
    inputs: Path,
    dst: Path,
    workers: int | None,
    resume: bool,
    strict: bool,
    overwrite: bool,
    fields: str | None,
    shard_size: str,
    jpeg_quality: int,
    check: str,
    part: str | None,
    quiet: bool,
    as_json: bool,
) -> None:
    """Run FUNCTION on every input of INPUTS and pack the samples it returns into DST.

    FUNCTION(input) returns a sample dict ({"__key__": ..., "jpg": ..., "cls": ...}), None
    (leave the input out) or a list of sample dicts. An input it fails on is skipped and
    listed (packer inspect --skipped DST). The bytes do not depend on --workers.

    \b
    Example:
      ls /data/wav/*/*.wav > clips.txt
      packer pack prep:to_spectrogram clips.txt mels.lmdb --workers 8
      packer pack prep:to_spectrogram clips.txt mels.lmdb --resume   # after a kill
      packer pack prep:to_spectrogram clips.txt mels.lmdb --part $SLURM_ARRAY_TASK_ID/8
      packer merge mels.lmdb                                        # once all 8 are done
    """
    from packer.write.pack import pack as run
    from packer.write.tasks import parse_part

    names = [n.strip() for n in fields.split(",")] if fields else None
    result = run(
        read_inputs(inputs), dst, load_function(function), workers=workers, resume=resume,
        strict=strict, progress=not (quiet or as_json), fields=names, shard_size=shard_size,
        overwrite=overwrite, jpeg_quality=jpeg_quality, check=cast("Check", check),
        part=parse_part(part) if part is not None else None,
    )  # fmt: skip
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.summary())
