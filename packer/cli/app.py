"""The ``packer`` command line: each command parses, calls one library function, and echoes."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import click

from packer import __version__
from packer.cli.fields import field_options
from packer.cli.upload import (
    OutputPath,
    SourcePath,
    convert_with,
    kept_in,
    upload_kwargs,
    upload_options,
)
from packer.cli.util import (
    CONTEXT,
    DatasetPath,
    flag,
    friendly,
    json_flag,
    positive_int,
    quiet_flag,
    safe_output,
    size_option,
    storage_option,
)
from packer.core.sizes import format_size


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="packer")
def main() -> None:
    """packer: pack image folders into LMDB, HDF5, NPY or BMP and read them fast in PyTorch."""
    safe_output()


@main.command(context_settings=CONTEXT)
@click.argument("src", type=SourcePath())
@click.argument("dst", type=OutputPath())
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["lmdb", "hdf5", "npy", "bmp"]),
    help="Force the format (default: from DST's suffix).",
)
@size_option("--shard-size", "1GiB", "Roll to a new shard past this size: 16MB, 512MiB, 1GB.")
@positive_int(
    "--workers", text="Parallel readers (default: CPU count). Output is identical for any value."
)
@flag(
    "--overwrite",
    text="Replace DST (a folder packer wrote, never other data) once the new one is complete.",
)
@flag(
    "--resume",
    text="Continue an interrupted conversion (DST.partial) from its last complete shard, "
    "publish one that had finished, or report DST complete.",
)
@flag("--strict", text="Fail on the first unusable input instead of skipping.")
@click.option(
    "--check",
    type=click.Choice(["scan", "fast", "decode"]),
    default="scan",
    show_default=True,
    help="scan: header, JPEG end marker and the whole compressed stream (a 1/8-scale decode), "
    "so corrupt data never reaches training; fast: header + end marker only; decode: full decode.",
)
@click.option(
    "--labels",
    "labels_given",
    multiple=True,
    metavar="[SPLIT=]FILE",
    help="Labels of a flat folder of images: a CSV with a header (name, label) or 'name label' "
    "lines; ImageNet's LOC_val_solution.csv reads as it ships. On a root of splits, FILE labels "
    "the one flat split (imagenet/val/); SPLIT=FILE names the split (repeatable).",
)
@click.option(
    "--classes",
    "classes_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Pin the class index: one class name per line, in label order.",
)
@click.option(
    "--classes-from",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Pin the class index to a packer output's (e.g. the train output), so both agree.",
)
@flag(
    "--allow-empty",
    text="Keep a class folder without images as a class with no samples (else an error).",
)
@click.option(
    "--split",
    "splits",
    multiple=True,
    help="For a root of split folders (train/, val/, ...): convert this split only (repeatable).",
)
@size_option(
    "--max-file-size", "64MB", "Skip (and list) a source file larger than this, before reading it."
)
@positive_int(
    "--max-pixels",
    default=90_000_000,
    show_default=True,
    text="Skip (and list) an image with more pixels than this, before decompressing it.",
)
@field_options
@click.option(
    "--quality",
    type=click.IntRange(1, 100),
    help="JPEG quality of re-encoded images and frames (resized ones, decoded video files) "
    "[default: 90].",
)
@positive_int(
    "--max-side",
    text="Shrink images (and frames) whose longer side exceeds this; aspect kept, never "
    "enlarged; images within it keep their bytes.",
)
@positive_int(
    "--short-side",
    text="Shrink images (and frames) to this shorter side, e.g. 256 (decode cost falls with "
    "the pixels removed: 2.1× fewer for a 500×375 photo); "
    "aspect kept, never enlarged; images within it keep their bytes.",
)
@click.option(
    "--fps",
    type=click.FloatRange(min=0, min_open=True),
    help="Video files: keep this many frames per second.",
)
@flag("--skip-bad-frames", text="Video: drop an unreadable frame instead of skipping its video.")
@flag(
    "--reencode",
    text="With --quality: re-encode every image, also those within --short-side/--max-side.",
)
@click.option(
    "--size",
    type=click.IntRange(1, 4096),
    help="Into .npy: store decoded SIZE×SIZE RGB pixels (short side to SIZE, centre crop), "
    "read with no decode; for small-image sets (e.g. 64-128 px ImageNet variants).",
)
@json_flag("Print one JSON summary instead of text.")
@click.option(
    "--dask",
    metavar="ADDRESS",
    help="One task per shard on a dask.distributed cluster sharing SRC and DST's folder: "
    "tcp://scheduler:8786, or local:N for N worker processes here. Same output bytes.",
)
@click.option(
    "--part",
    metavar="I/N",
    help="Convert only planned shards k with k % N == I, into DST.part-I/ (e.g. one SLURM "
    "array task each); then join the parts with packer merge DST.",
)
@upload_options(streams=True)
@quiet_flag()
@friendly
def convert(
    src: Path | str,
    dst: Path,
    fmt: str | None,
    shard_size: str,
    workers: int | None,
    overwrite: bool,
    resume: bool,
    strict: bool,
    check: str,
    labels_given: tuple[str, ...],
    classes_file: Path | None,
    classes_from: Path | None,
    allow_empty: bool,
    splits: tuple[str, ...],
    max_file_size: str,
    max_pixels: int,
    kind: str | None,
    require: tuple[str, ...],
    image_column: str | None,
    annotations: tuple[Path, ...],
    follow_links: bool,
    quality: int | None,
    max_side: int | None,
    short_side: int | None,
    fps: float | None,
    skip_bad_frames: bool,
    reencode: bool,
    size: int | None,
    as_json: bool,
    dask: str | None,
    part: str | None,
    staging: Path | None,
    keep_staging: bool,
    storage_options: dict[str, Any],
    staging_limit: str | None,
    quiet: bool,
) -> None:
    """Convert the image folder SRC (<class>/<image>) into the packed dataset DST.

    A root of split folders (imagenet/ with train/ and val/) becomes one output holding every
    split, with one class index taken from train/ (--split NAME converts one); a flat split
    (ImageNet's val/) takes its labels file with --labels. Every split is checked before any
    is converted.

    Samples with fields too: files sharing a key (0001.jpg, 0001.txt), a field per suffix;
    WebDataset tars ('shards/{000000..000099}.tar', or at a URL: fetched first); a table
    (.csv/.tsv/.jsonl/.parquet) with an image column; COCO (--annotations).

    Video sources work the same way: <class>/<video>/<frame>.jpg frame folders (kept as they
    are) or <class>/<video>.mp4|.avi|.webm|.mkv files (decoded once with PyAV, stored as JPEG).

    The format follows DST's suffix: .lmdb, .h5/.hdf5, .npy, .bmp. Encoded bytes are copied
    unchanged (except .bmp, which stores decoded pixels, and --short-side/--max-side/--size). Unusable files are skipped and listed.
    An interrupted run leaves DST.partial/; run the same command with --resume to finish it.

    A URL DST (s3://bucket/out.lmdb, any writable fsspec store) is built in a local staging
    folder (--staging); each shard is uploaded as soon as it is finished and its staged copy
    freed, so staging holds a few shards; packer.json goes last, so a reader never sees half a
    dataset; --resume continues an interrupted upload without sending finished objects again.

    \b
    Example:
      packer convert imagenet/ imagenet.lmdb
      packer convert imagenet/ imagenet.lmdb --labels LOC_val_solution.csv
      packer convert imagenet/train train.lmdb --shard-size 1GB
      packer convert val_flat/ val.lmdb --labels LOC_val_solution.csv --classes-from train.lmdb
      packer convert imagenet/ imagenet-256.lmdb --short-side 256
      packer convert tiny-imagenet/train tiny.npy --size 64
      packer convert ucf101/ ucf101.npy --short-side 256 --fps 10
      packer convert pairs/ pairs.lmdb --require txt
      packer convert 'shards/{000000..000009}.tar' pairs.npy
      packer convert imagenet/train train.lmdb --dask tcp://scheduler:8786
      packer convert imagenet/train train.lmdb --part $SLURM_ARRAY_TASK_ID/16
      packer convert imagenet/ s3://bucket/imagenet.lmdb --storage-option endpoint_url=http://minio:9000
    """
    import dataclasses

    from packer.cli.convert_options import convert_options
    from packer.write.dask_client import dask_client

    ctx = click.get_current_context()
    options = convert_options(ctx.params)
    if dask:
        options = dataclasses.replace(options, executor=ctx.with_resource(dask_client(dask)))
    part_of = options.part
    uploads = upload_kwargs(dst, staging, keep_staging, storage_options, staging_limit, src)
    try:
        result = convert_with(src, dst, options, uploads)
    except KeyboardInterrupt:
        kept = kept_in(dst, part_of, staging, storage_options)
        again = " ".join(shlex.quote(a) for a in sys.argv[1:] if a != "--resume")
        click.echo(
            f"\ninterrupted: the finished shards are kept in {kept}.partial/; continue with\n"
            f"  packer {again} --resume",
            err=True,
        )
        sys.exit(130)
    click.echo(json.dumps(result.to_dict(), indent=2) if as_json else result.summary())


@main.command(context_settings=CONTEXT)
@click.argument("workdir", type=click.Path(path_type=Path), default="demo-data")
@click.option("--classes", default=8, show_default=True, help="Class folders to generate.")
@click.option("--per-class", default=100, show_default=True, help="Images (or videos) per class.")
@click.option(
    "--kind",
    type=click.Choice(["image", "video", "fields"]),
    default="image",
    show_default=True,
    help="Demo images, video frame folders, or image-caption samples with fields.",
)
@quiet_flag("No progress bars.")
@friendly
def demo(workdir: Path, classes: int, per_class: int, kind: str, quiet: bool) -> None:
    """Generate photo-like JPEGs (or video frame folders), convert them to every format, and
    time reading each back.

    \b
    Example:
      packer demo /tmp/packer-demo --per-class 200
      packer demo /tmp/packer-video --kind video
      packer demo /tmp/packer-captions --kind fields
    """
    results: list[Any]
    if kind == "fields":
        from packer.demo.fields import run_fields_demo

        click.echo("\n".join(run_fields_demo(workdir, classes * per_class, not quiet)))
        return
    if kind == "video":
        from packer.demo.video import run_video_demo

        video_tree, results, rows = run_video_demo(workdir, classes, per_class, progress=not quiet)
        click.echo(f"generated {len(video_tree.videos)} frame folders in {video_tree.root}")
        unit, batch = "clips", 16
    else:
        from packer.demo.image import run_demo

        tree, results, rows = run_demo(workdir, classes, per_class, progress=not quiet)
        click.echo(f"generated {len(tree.good)} JPEGs, {len(tree.bad)} truncated, in {tree.root}")
        unit, batch = "img", 64
    for result in results:
        click.echo(result.summary())
    click.echo(
        f"\nreading through a DataLoader (num_workers=0, batch {batch}, warm cache, median of 3):\n"
    )
    click.echo(f"| dataset | on disk | bytes {unit}/s | × folder | decoded {unit}/s | × folder |")
    click.echo("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        click.echo(
            f"| {row.name} | {format_size(row.disk_bytes)} | {row.bytes_per_s:,.0f} | "
            f"{row.bytes_per_s / rows[0].bytes_per_s:.2f} | {row.decoded_per_s:,.0f} | "
            f"{row.decoded_per_s / rows[0].decoded_per_s:.2f} |"
        )


@main.command(context_settings=CONTEXT)
@click.argument("dst", type=DatasetPath())
@flag("--full", text="Also decode every sample.")
@positive_int("--workers", text="Threads decoding with --full (default: CPU count).")
@json_flag("Print the result as one JSON object.")
@quiet_flag()
@storage_option()
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="A URL's shards are checked in this node-local shard cache: left warm.")  # fmt: skip
@friendly
def verify(
    dst: Any,
    full: bool,
    workers: int | None,
    as_json: bool,
    quiet: bool,
    storage_options: Any,
    cache_dir: Path | None,
) -> None:
    """Check a packed dataset: file checksums, every sample's checksum, and (--full) decoding.

    Each problem is reported with its shard and sample key; the exit status is 1 if any.

    \b
    Example:
      packer verify train.lmdb --full
      packer verify s3://bucket/train.npy --cache-dir /scratch/packer-cache
    """
    from packer.read.verify import verify as run

    progress = not (quiet or as_json) and sys.stderr.isatty()  # no bar written into a log file
    report = run(dst, full, progress, workers or 0, storage_options or None, cache_dir)
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else report.summary())
    if not report.ok:
        sys.exit(1)


def _register_measure_commands() -> None:
    from packer.cli import cache, describe, measure, merge, pack

    for command in (measure.bench, cache.cache, measure.doctor, describe.inspect, merge.merge):
        main.add_command(command)
    main.add_command(pack.pack)


_register_measure_commands()
