"""``packer convert``'s options for what a source holds: ``--kind`` and the options of sources of
samples with fields (``--require``, ``--image-column``, ``--annotations``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

__all__ = ["field_options"]

KINDS = ["image", "video", "files", "tars", "table", "coco", "audio"]
KIND_HELP = (
    "image: <class>/<image>; video: <class>/<video>/<frame> or <class>/<video>.mp4. Samples "
    "with fields: files (sharing a key: 0001.jpg, 0001.txt), tars (WebDataset shards), table "
    "(.csv/.tsv/.jsonl/.parquet, a row per sample), coco (an image folder with --annotations), audio "
    "(<class>/<clip>.wav, .flac, ...: fields audio and label) [default: detected, stated in the summary; a tree that could be either asks for --kind]."
)


def field_options(func: Any) -> Any:
    """Add ``--kind``, ``--require``, ``--image-column``, ``--annotations`` and
    ``--follow-links`` to a command."""
    func = click.option(
        "--follow-links",
        is_flag=True,
        help="Samples with fields: read a file or folder through a symbolic link whose target "
        "leaves the source (without it, such a sample is skipped and listed). Class and video "
        "trees always follow links, as ImageFolder does.",
    )(func)
    func = click.option(
        "--annotations",
        metavar="FILE",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="COCO: an instances or captions JSON for the image folder SRC (repeatable: "
        "instances_val2017.json and captions_val2017.json); implies --kind coco.",
    )(func)
    func = click.option(
        "--image-column",
        metavar="NAME",
        help="A table's column of image paths, relative to the table [default: the first of "
        "image, image_path, path, file, filename, file_name, jpg, png].",
    )(func)
    func = click.option(
        "--require",
        metavar="FIELD",
        multiple=True,
        help="Samples with fields: skip (and list) a sample without this field (repeatable).",
    )(func)
    return click.option("--kind", type=click.Choice(KINDS), help=KIND_HELP)(func)
