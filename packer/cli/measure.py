"""The ``packer bench`` and ``packer doctor`` commands (registered on the main group in cli.py)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from packer.cli.util import (
    CONTEXT,
    batch_size_option,
    flag,
    friendly,
    positive_int,
    storage_option,
)
from packer.errors import PackerError
from packer.remote.storage import is_url

__all__ = ["bench", "doctor"]


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise PackerError(
            f"{name} expects comma-separated integers such as 0,2,4, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise PackerError(f"{name} expects integers >= 0 such as 0,2,4, got {text!r}")
    return values


JSON_HELP = "Print the results as one JSON object on stdout (instead of text)."


def _json_mode(value: str | None, out: Path | None) -> tuple[bool, Path | None, str | None]:
    """Read ``--json`` (a flag) and ``--json-out PATH``: (print JSON, file to write, stray).

    ``--json`` used to take a PATH on these commands: a value ending in ``.json`` still writes
    that file, with a deprecation warning; any other value is the command's own PATH argument
    that followed the flag (``packer doctor --json data/``), returned as ``stray``.
    """
    if value is None or value == "-":
        return value is not None, out, None
    if value.lower().endswith(".json"):
        click.echo(
            f"warning: --json {value} is deprecated: --json-out {value} writes the file,"
            " --json alone prints JSON",
            err=True,
        )
        return False, out or Path(value), None
    return True, out, value


def json_options(func: Any) -> Any:
    """``--json`` (flag) and ``--json-out PATH``, the same on ``bench`` and ``doctor``."""
    func = click.option("--json-out", "json_out", type=click.Path(path_type=Path),
                        help="Also save the JSON to this file.")(func)  # fmt: skip
    return click.option("--json", "json_value", is_flag=False, flag_value="-", default=None,
                        metavar="", help=JSON_HELP)(func)  # fmt: skip


def _report(runs: list[Any], costs: list[Any], options: dict[str, Any], complete: bool) -> None:
    from packer.bench.bench_report import (
        bench_json,
        plot_runs,
        runs_table,
        stalls_text,
        storage_table,
    )

    as_json = bool(options.get("as_json"))
    if as_json:
        click.echo(bench_json(runs, costs, options, complete))
    if costs and not as_json:
        click.echo(
            "\nwhat each sample costs the storage (kernel counters of the reading process):\n"
        )
        click.echo(storage_table(costs))
    if runs and not as_json:
        click.echo(f"\nthroughput through a DataLoader (batch {options['batch_size']}; × first = "
                   f"ratio to {runs[0].label} in the same mode, workers and cache):\n")  # fmt: skip
        click.echo(runs_table(runs))
        for line in stalls_text(runs):
            click.echo(f"\nstall: {line}")
    if options.get("json_out"):
        Path(options["json_out"]).write_text(bench_json(runs, costs, options, complete))
        click.echo(f"\nwrote {options['json_out']}", err=as_json)
    if options.get("plot") and runs:
        plot_runs(options["plot"], runs)
        click.echo(f"wrote {options['plot']}", err=as_json)


@click.command(context_settings=CONTEXT)
@click.argument("paths", nargs=-1, metavar="PATH|URL...")
@click.option("--workers", default="0,2,4", show_default=True, help="num_workers values to sweep.")
@batch_size_option()
@click.option("--mode", "modes", default="bytes", show_default=True,
              help="Comma-separated: bytes (IO + format), decode, transform (decode + crop/flip).")  # fmt: skip
@positive_int("--epochs", default=1, show_default=True)
@click.option("--warmup", default=1, show_default=True, type=click.IntRange(min=0),
              help="Untimed epochs before the timed ones (warm runs).")  # fmt: skip
@flag("--cold", text="Evict the files from the page cache before each epoch.")
@positive_int("--limit", text="Read only the first N samples.")
@flag("--shuffle", text="Random order (seeded), as in training.")
@click.option(
    "--step-ms", default=0.0, type=click.FloatRange(min=0), help="Simulated step (sleep)."
)
@click.option("--storage/--no-storage", default=True, help="Measure per-sample storage cost.")
@click.option("--decoder", default="auto", show_default=True,
              help="Decoder of the decode/transform modes: auto, pillow, simplejpeg, turbojpeg, "
              "opencv.")  # fmt: skip
@positive_int("--short-side",
              text="Also bench a copy of each dataset's samples stored at this short side "
              "(what packer convert --short-side N gives), side by side.")  # fmt: skip
@storage_option()
@json_options
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Save a PNG plot here.")
@friendly
def bench(paths: tuple[Any, ...], workers: str, modes: str, json_value: str | None,
          json_out: Path | None, plot_path: Path | None, storage: bool, short_side: int | None,
          storage_options: dict[str, Any], **kw: Any) -> None:  # fmt: skip
    """Time reading packer outputs and image folders through a real DataLoader.

    The first PATH is the baseline of the ratios. Ctrl-C prints what was measured so far.
    A URL (s3://, https://; --storage-option for the endpoint) is read from the store: its
    storage counters are not measured and --cold evicts nothing of it (no local files).

    \b
    Example:
      packer bench images/ images.lmdb images.npy --workers 0,2 --mode bytes,decode --plot b.png
      packer bench images.lmdb --json > bench.json
    """
    from packer.bench.bench import BenchSpec, check_paths, plan, run_bench
    from packer.bench.storage_cost import measure_storage
    from packer.decode.registry import check_decoder
    from packer.diagnosis.io_counters import io_available
    from packer.diagnosis.targets import cold_supported, path_labels

    as_json, json_out, stray = _json_mode(json_value, json_out)
    texts = (stray, *paths) if stray else paths
    if not texts:
        raise click.UsageError("give at least one PATH to bench")
    urls = [t for t in texts if is_url(t)]
    if storage_options and not urls:
        raise click.UsageError("--storage-option is for a URL dataset (s3://..., https://...)")
    if urls and short_side is not None:
        raise click.UsageError(f"--short-side needs local datasets, not {urls[0]}")
    paths = tuple(t if is_url(t) else Path(t) for t in texts)
    spec = BenchSpec(workers=_int_list(workers, "--workers"), modes=modes.split(","),
                     storage_options=storage_options or None, **kw)  # fmt: skip
    spec.validate()
    check_decoder(spec.decoder)
    check_paths(paths, spec.storage_options)
    if short_side is not None:
        paths = _with_resized(paths, short_side, spec.limit)
    options = {**kw, "paths": [str(p) for p in paths], "workers": spec.workers,
               "modes": list(spec.modes), "json_out": json_out, "plot": plot_path,
               "as_json": as_json}  # fmt: skip
    if spec.cold and not cold_supported():
        click.echo("warning: --cold needs os.posix_fadvise, absent here; warm runs only", err=True)
    total = len(plan(paths, spec))
    runs: list[Any] = []
    costs: list[Any] = []
    try:
        if storage and not io_available():
            click.echo("warning: /proc/<pid>/io is not readable; no storage counters", err=True)
        elif storage:
            for path, label in zip(paths, path_labels(paths)):
                if not is_url(path):  # kernel counters see no store's bytes
                    costs.append(measure_storage(path, label, spec.limit, spec.batch_size))
        for run in run_bench(paths, spec):
            runs.append(run)
            click.echo(f"[{len(runs)}/{total}] {run.label} {run.mode} workers={run.workers} "
                       f"{run.cache}: {run.images_per_s:,.0f} images/s", err=True)  # fmt: skip
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: {len(runs)} of {total} runs measured", err=True)
        _report(runs, costs, options, complete=False)
        sys.exit(130)
    _report(runs, costs, options, complete=True)


def _with_resized(paths: tuple[Path, ...], short_side: int, limit: int | None) -> tuple[Path, ...]:
    """``paths`` plus, for each, a copy of its benched samples stored at ``short_side``."""
    import tempfile

    from packer.bench.resized_copy import resized_copy

    workdir = Path(tempfile.mkdtemp(prefix="packer-bench-"))
    click.get_current_context().call_on_close(lambda: shutil.rmtree(workdir, ignore_errors=True))
    click.echo(f"writing copies at short side {short_side} in {workdir} ...", err=True)
    return paths + tuple(resized_copy(p, short_side, limit, workdir) for p in paths)


@click.command(context_settings=CONTEXT)
@click.argument("path", required=False, metavar="PATH|URL")
@click.option("--step-ms", type=click.FloatRange(min=0, min_open=True),
              help="Your training step time; the worker count is computed for it.")  # fmt: skip
@batch_size_option()
@click.option("--cache-dir", type=click.Path(path_type=Path),
              help="A URL's node-local shard cache to report on (default: packer's).")  # fmt: skip
@storage_option()
@click.option("--workers", type=click.IntRange(min=0), help="num_workers of the loader run.")
@click.option("--budget", default=60.0, show_default=True, type=click.FloatRange(min=1),
              help="Upper bound on the measuring time, in seconds.")  # fmt: skip
@click.option("--loader", "loader_spec", help="module:function returning YOUR DataLoader.")
@click.option("--steps", default=50, show_default=True, type=click.IntRange(min=2),
              help="Batches to time with --loader.")  # fmt: skip
@json_options
@friendly
def doctor(path: str | None, step_ms: float | None, batch_size: int, workers: int | None,
           budget: float, loader_spec: str | None, steps: int, json_value: str | None,
           json_out: Path | None, storage_options: dict[str, Any],
           cache_dir: Path | None) -> None:  # fmt: skip
    """Measure where loading time goes on this machine, explain stalls, say what to change.

    Give a dataset PATH (packer output or image folder), or --loader module:function for
    your own DataLoader. The report recommends one num_workers, from the measured cost of a
    sample, the step time and the CPUs.

    A URL (s3://, https://, any fsspec protocol; --storage-option for the endpoint) measures
    the store instead of the disk: the open, the latency of a ranged GET, the bandwidth of one
    and of several streams, a batch in order and a shuffled batch; it recommends num_workers,
    prefetch and cache_limit.

    \b
    Example:
      packer doctor imagenet/train --step-ms 120
      packer doctor --loader train:make_loader --step-ms 120
      packer doctor images.lmdb --step-ms 120 --json > doctor.json
      packer doctor s3://bucket/train.npy --storage-option endpoint_url=http://minio:9000
    """
    as_json, json_out, stray = _json_mode(json_value, json_out)
    if stray is not None and path is not None:
        raise click.UsageError(f"--json takes no value, got {stray!r}; --json-out PATH saves it")
    path = stray if stray is not None else path
    if (path is None) == (loader_spec is None):
        raise click.UsageError("give either a dataset PATH or --loader module:function")
    if storage_options and not (path is not None and is_url(path)):
        raise click.UsageError("--storage-option is for a URL dataset (s3://..., https://...)")
    if loader_spec is not None:
        from packer.diagnosis.diagnose import diagnose, load_loader

        report: Any = diagnose(load_loader(loader_spec), steps, step_ms or 0.0, budget)
    elif is_url(path):
        from packer.diagnosis.doctor_remote import doctor_remote

        where = str(cache_dir) if cache_dir else None
        report = doctor_remote(str(path), storage_options, step_ms, batch_size, cache_dir=where)
    else:
        from packer.diagnosis.doctor import doctor as run

        report = run(Path(str(path)), step_ms, batch_size, workers, budget)
    data = json.dumps(report.to_dict(), indent=2, default=str)
    click.echo(data if as_json else str(report))
    if json_out is not None:
        json_out.write_text(data)
        click.echo(f"\nwrote {json_out}", err=as_json)
