#!/usr/bin/env python
"""Writers side by side (issue 44, item 5): ``packer.Writer`` and ``packer.pack`` against MosaicML
Streaming's ``MDSWriter``, WebDataset's ``ShardWriter`` and LitData's ``optimize``, in one run.

Data: the image–caption set of ``fields_read.py`` (``--samples`` photo-like 400×350 JPEGs,
quality 90, ~87 KB, with a caption and a class; :func:`packer.demo.fields.make_caption_set`,
made once under ``--root``). Each pass runs in a fresh process that first reads every sample into
memory (not timed), then writes ``{key, jpg: bytes, txt: str, cls: int}`` as each tool's users
write it, all with 64 MB shards (``--shard-mb``), no compression:

- ``packer.Writer .lmdb`` / ``.npy``: ``with packer.Writer(out, check=C) as w: w.write(sample)``;
- ``MDSWriter``: ``columns={"key": "str", "jpg": "bytes", "txt": "str", "cls": "int"}``;
- ``wds.ShardWriter``: ``ShardWriter("out/%06d.tar", maxsize=...).write(sample)``;
- ``pack(workers=N)``: ``packer.pack(range(n), out, fn, workers=N, check=C)`` (``.lmdb``);
- ``optimize(num_workers=N)``: ``litdata.optimize(fn, range(n), out, num_workers=N,
  start_method="fork")`` (fork, as ``pack``'s pool: no re-import of this script per worker).

packer's passes run at each ``--checks`` level ``C`` of the bytes given (``scan``, the default,
walks every JPEG's compressed stream: ~1 CPU ms a photo; ``fast`` reads its header and end
marker; the peers check nothing); a level other than ``scan`` is named in the row
(``packer.Writer .npy check=fast``).

``fn`` is ``copy`` (the sample as it is) or ``resize`` (a real ~2 ms CPU cost: the JPEG decoded,
resized to 256×224, re-encoded at quality 90, as a preprocessing step would). The serial writers
run the same ``fn`` inline. A pass's time runs from the first write to the writer's close (the
dataset complete); ``durable`` adds an fsync of every output file (packer fsyncs its own already).

Every output is verified after its timing: the tool's own reader finds every key once, and the
bytes, caption and class of every sample (``copy``) or of five spread samples recomputed
(``resize``) equal what was given. Passes are interleaved, one warm-up round first, medians of
``--repeats``; each pass records the CPU share other processes took meanwhile.

Targets, per check level: the faster ``packer.Writer`` ≥ 1.2 × the fastest single-process peer
writer (``copy``), ``pack(workers=2)`` ≥ 1.7 × ``pack(workers=1)`` (``resize``). Medians of the
rounds, with the spread (lowest–highest). Run in the peers' venv (``benchmarks/peers_env.sh``),
niced on a shared machine::

    PYTHONPATH=$PWD nice -n 5 /work/benchvenv/bin/python benchmarks/write_throughput.py \
        --checks scan fast
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from harness.host_load import host_busy_seconds, others_during, own_usage
from harness.record import report_head, run_costs, save_report, stamped_log

SERIAL = ("packer.Writer .lmdb", "packer.Writer .npy", "MDSWriter", "wds.ShardWriter")
PARALLEL = ("pack", "optimize")
FNS = ("copy", "resize")
CHECKS = ("scan", "fast", "decode")  # packer's check levels; "scan" is the default
PEERS = ("MDSWriter", "wds.ShardWriter", "optimize")
SPOT = 5  # samples whose bytes a ``resize`` pass recomputes
_SAMPLES: list[dict[str, Any]] = []  # this pass's samples, in memory (inherited by fork)
_FN = "copy"


def _resized(jpg: bytes) -> bytes:
    """The ~2 ms preprocessing: decode, resize to 256×224, re-encode (quality 90)."""
    from PIL import Image

    image = Image.open(io.BytesIO(jpg)).convert("RGB")
    out = io.BytesIO()
    image.resize((256, 224), Image.Resampling.BILINEAR).save(out, format="JPEG", quality=90)
    return out.getvalue()


def make_sample(index: int, fn: str | None = None) -> dict[str, Any]:
    """Sample ``index`` after ``fn`` (default: this pass's): ``__key__``, jpg, txt, cls."""
    sample = _SAMPLES[index]
    if (fn or _FN) == "resize":
        return {**sample, "jpg": _resized(sample["jpg"])}
    return sample


def _litdata_fn(index: int) -> dict[str, Any]:
    sample = make_sample(index)
    return {"key": sample["__key__"], "jpg": sample["jpg"], "txt": sample["txt"],
            "cls": sample["cls"]}  # fmt: skip


def photos(root: Path, samples: int) -> Path:
    """``root/n<samples>/files``: fields_read.py's caption set (made when missing)."""
    files = root / f"n{samples}" / "files"
    if len(list(files.glob("*.jpg"))) != samples:
        from packer.demo.fields import make_caption_set

        make_caption_set(files, samples, size=(400, 350), seed=0)
    return files


def load_samples(files: Path, samples: int) -> list[dict[str, Any]]:
    """Every sample's fields, in memory: key, JPEG bytes, caption, class."""
    out = []
    for i in range(samples):
        stem = files / f"{i:06d}"
        out.append({
            "__key__": stem.name, "jpg": stem.with_suffix(".jpg").read_bytes(),
            "txt": stem.with_suffix(".txt").read_text("utf-8"),
            "cls": int(stem.with_suffix(".cls").read_text()),
        })  # fmt: skip
    return out


def write(tool: str, out: Path, workers: int, shard_mb: int, check: str = "scan") -> None:
    """Write every sample to ``out`` with ``tool``, as its users do (packer's at ``check``)."""
    n, shard = len(_SAMPLES), shard_mb * 1_000_000
    if tool.startswith("packer.Writer"):
        import packer

        with packer.Writer(out, shard_size=shard, check=check) as writer:
            for i in range(n):
                writer.write(make_sample(i))
    elif tool == "pack":
        import packer

        packer.pack(range(n), out, make_sample, workers=workers, shard_size=shard, check=check,
                    progress=False)  # fmt: skip
    elif tool == "MDSWriter":
        from streaming import MDSWriter

        columns = {"key": "str", "jpg": "bytes", "txt": "str", "cls": "int"}
        with MDSWriter(out=str(out), columns=columns, size_limit=shard) as mds:
            for i in range(n):
                sample = make_sample(i)
                mds.write(
                    {"key": sample["__key__"], **{k: sample[k] for k in ("jpg", "txt", "cls")}}
                )
    elif tool == "wds.ShardWriter":
        import webdataset as wds

        out.mkdir()
        with wds.ShardWriter(str(out / "%06d.tar"), maxsize=shard, maxcount=10**9, verbose=0) as sw:
            for i in range(n):
                sw.write(make_sample(i))
    else:
        import litdata

        litdata.optimize(
            fn=_litdata_fn, inputs=list(range(n)), output_dir=str(out), chunk_bytes=shard,
            num_workers=workers, reorder_files=False, mode="overwrite", verbose=False,
            start_method="fork",
        )  # fmt: skip


def read_back(tool: str, out: Path) -> Iterator[tuple[str, bytes, str, int]]:
    """Every sample of ``out`` through its tool's own reader: key, jpg, caption, class."""
    if tool.startswith("packer") or tool == "pack":
        import packer

        dataset = packer.open_dataset(out, output="bytes")
        for i in range(len(dataset)):
            item = dataset[i]
            yield item["__key__"], item["jpg"], item["txt"].decode(), int(item["cls"])
    elif tool == "MDSWriter":
        from streaming.base.format import reader_from_json

        for shard in json.loads((out / "index.json").read_text())["shards"]:
            reader = reader_from_json(str(out), None, shard)
            for j in range(reader.samples):
                item = reader.get_item(j)
                yield item["key"], item["jpg"], item["txt"], item["cls"]
    elif tool == "wds.ShardWriter":
        for path in sorted(out.glob("*.tar")):
            members: dict[str, dict[str, bytes]] = {}
            with tarfile.open(path) as tar:
                for member in tar:
                    key, field = member.name.split(".", 1)
                    handle = tar.extractfile(member)
                    assert handle is not None, member.name
                    members.setdefault(key, {})[field] = handle.read()
            for key, f in members.items():
                yield key, f["jpg"], f["txt"].decode(), int(f["cls"])
    else:
        import litdata

        dataset = litdata.StreamingDataset(str(out))
        for i in range(len(dataset)):
            item = dataset[i]
            yield item["key"], item["jpg"], item["txt"], item["cls"]


def verify(tool: str, out: Path, fn: str) -> int:
    """Check ``out`` holds every sample once with the bytes given; the samples read."""
    n = len(_SAMPLES)
    spots = {round(k * (n - 1) / (SPOT - 1)) for k in range(SPOT)} if n >= SPOT else set(range(n))
    seen: set[str] = set()
    for key, jpg, txt, cls in read_back(tool, out):
        assert key not in seen, f"{tool}: key {key} twice"
        seen.add(key)
        index = int(key)
        if fn == "copy" or index in spots:
            want = make_sample(index, fn)
            got = (jpg, txt, cls)
            assert got == (want["jpg"], want["txt"], want["cls"]), f"{tool}: sample {key} differs"
    assert seen == {s["__key__"] for s in _SAMPLES}, f"{tool}: {len(seen)} of {n} samples read"
    return len(seen)


def _fsync_tree(path: Path) -> None:
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def preload(tool: str) -> None:
    """Import ``tool``'s library before the clock starts (Streaming's import alone takes ~1.5 s:
    a start-up cost, not a writer's)."""
    import importlib

    names = {"MDSWriter": "streaming", "wds.ShardWriter": "webdataset", "optimize": "litdata"}
    module = importlib.import_module(names.get(tool, "packer"))
    if module.__name__ == "packer":
        module.Writer, module.pack  # noqa: B018 - the lazy public names loaded


def one_pass(cfg: dict[str, Any]) -> dict[str, Any]:
    """One timed write of one tool in this (fresh) process, then its output verified."""
    global _SAMPLES, _FN
    _SAMPLES, _FN = load_samples(Path(cfg["files"]), cfg["samples"]), cfg["fn"]
    out = Path(cfg["out"])
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    preload(cfg["tool"])
    gc.collect()
    host, cpu = host_busy_seconds(), own_usage()[0]
    start = time.perf_counter()
    write(cfg["tool"], out, cfg["workers"], cfg["shard_mb"], cfg.get("check", "scan"))
    closed = time.perf_counter() - start
    _fsync_tree(out)
    durable = time.perf_counter() - start
    used = own_usage()[0] - cpu
    others = others_during(host, host_busy_seconds(), used, durable)
    files = sum(1 for p in out.rglob("*") if p.is_file())
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    count = verify(cfg["tool"], out, cfg["fn"])
    shutil.rmtree(out)
    return {"samples": count, "closed_s": closed, "durable_s": durable, "cpu_s": used,
            "others_share": others, "files": files, "bytes": size}  # fmt: skip


def run_pass(cfg: dict[str, Any], log: Any = None) -> dict[str, Any]:
    """:func:`one_pass` in a fresh process (this script ``--one-pass CFG``): its JSON. A pass
    that fails is run once more (its error logged, and counted in the result's ``retried``)."""
    command = [sys.executable, __file__, "--one-pass", json.dumps(cfg)]
    for attempt in (0, 1):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            return {**json.loads(done.stdout.strip().splitlines()[-1]), "retried": attempt}
        tail = "\n".join(done.stderr.strip().splitlines()[-6:])
        if log is not None:
            log(f"pass {cfg['tool']} {cfg['fn']} failed (exit {done.returncode}):\n{tail}")
    raise RuntimeError(f"the pass {cfg} failed twice; last error:\n{tail}")


def configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (tool, fn, workers, check) asked for: serial writers once, the maps per worker
    count, packer's per check level."""
    out = []
    for fn in args.fns:
        for tool in args.tools:
            for workers in args.workers if tool in PARALLEL else [1]:
                for check in args.checks if tool.startswith("pack") else ["scan"]:
                    out.append({"tool": tool, "fn": fn, "workers": workers, "check": check})
    return out


def label(cfg: dict[str, Any]) -> str:
    """A pass's row name; a packer check level other than the default is named."""
    check = cfg.get("check", "scan")
    named = f" check={check}" if check != "scan" and cfg["tool"].startswith("pack") else ""
    if cfg["tool"] == "pack":
        return f"pack(workers={cfg['workers']}){named}"
    if cfg["tool"] == "optimize":
        return f"optimize(num_workers={cfg['workers']})"
    return cfg["tool"] + named


def verdicts(
    medians: dict[str, dict[str, float]], checks: tuple[str, ...] | list[str] = ("scan",)
) -> list[dict[str, Any]]:
    """The issue's two targets at each check level, where this run measured what they
    compare."""
    out = []
    copy, resize = medians.get("copy", {}), medians.get("resize", {})
    peers = {k: v for k, v in copy.items() if k in ("MDSWriter", "wds.ShardWriter")}
    peers.update({k: v for k, v in copy.items() if k == "optimize(num_workers=1)"})
    for check in checks:
        named = f" check={check}" if check != "scan" else ""
        ours = {k: v for k, v in copy.items()
                if k in (f"packer.Writer .lmdb{named}", f"packer.Writer .npy{named}")}  # fmt: skip
        if ours and peers:
            best, peer = max(ours, key=ours.__getitem__), max(peers, key=peers.__getitem__)
            out.append({"measure": f"{best} / {peer} (copy)", "ratio": ours[best] / peers[peer],
                        "target": 1.2})  # fmt: skip
        one, two = f"pack(workers=1){named}", f"pack(workers=2){named}"
        if one in resize and two in resize:
            out.append({"measure": f"{two} / {one} (resize)", "ratio": resize[two] / resize[one],
                        "target": 1.7})  # fmt: skip
    for v in out:
        v["met"] = v["ratio"] >= v["target"]
    return out


def table(rows: dict[str, dict[str, dict[str, float]]]) -> str:
    """Markdown: medians by fn and writer (samples/s, durable, CPU), × the fastest peer."""
    lines = [
        "| fn | writer | samples/s | lowest–highest | durable samples/s | CPU ms/sample "
        "| others' CPU share | × fastest peer |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for fn, by_writer in rows.items():
        peers = [r["samples_per_s"] for k, r in by_writer.items() if k.startswith(PEERS)]
        for name, r in by_writer.items():
            ratio = f"{r['samples_per_s'] / max(peers):.2f}" if peers else "—"
            others = "—" if r["others_share"] is None else f"{r['others_share']:.2f}"
            low, high = r["samples_per_s_range"]
            lines.append(
                f"| {fn} | {name} | {r['samples_per_s']:,.0f} | {low:,.0f}–{high:,.0f} "
                f"| {r['durable_samples_per_s']:,.0f} | {r['cpu_ms_per_sample']:.2f} | {others} "
                f"| {ratio} |"
            )
    return "\n".join(lines)


def summary(runs: list[dict[str, Any]], samples: int) -> dict[str, Any]:
    """The medians of one writer's timed passes, and the spread of its rate."""
    shares = [r["others_share"] for r in runs if r["others_share"] is not None]
    rates = [samples / r["closed_s"] for r in runs]
    return {
        "samples_per_s": statistics.median(rates),
        "samples_per_s_range": [min(rates), max(rates)],
        "durable_samples_per_s": statistics.median(samples / r["durable_s"] for r in runs),
        "cpu_ms_per_sample": statistics.median(1e3 * r["cpu_s"] / samples for r in runs),
        "others_share": statistics.median(shares) if shares else None,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5000)
    parser.add_argument("--root", type=Path, default=Path("/work/bench-fields"))
    parser.add_argument("--work", type=Path, default=None, help="outputs (default ROOT/write)")
    parser.add_argument("--tools", nargs="+", default=[*SERIAL, *PARALLEL],
                        choices=[*SERIAL, *PARALLEL])  # fmt: skip
    parser.add_argument("--fns", nargs="+", default=list(FNS), choices=FNS)
    parser.add_argument("--checks", nargs="+", default=["scan"], choices=CHECKS,
                        help="packer's check levels of the bytes given (default: scan)")  # fmt: skip
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--shard-mb", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-warmup", action="store_true", help="skip the warm-up round")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", default="write_throughput", help="the JSON's file name")
    parser.add_argument("--one-pass", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.samples < 1:
        parser.error("--repeats and --samples must be >= 1")
    return args


def main(args: argparse.Namespace) -> int:
    """Make the photos, run every pass interleaved, print the table, write the JSON."""
    if args.one_pass:
        print(json.dumps(one_pass(json.loads(args.one_pass))))
        return 0
    started = time.perf_counter()
    log = stamped_log(started)
    from harness.throughput_report import machine_info

    info = machine_info()
    files, work = photos(args.root, args.samples), args.work or args.root / "write"
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, Any]]] = {}
    grid = configs(args)
    for repeat in range(-1 if not args.no_warmup else 0, args.repeats):
        for cfg in grid:
            name = f"{cfg['fn']} {label(cfg)}"
            suffix = ".npy" if cfg["tool"].endswith(".npy") else ".lmdb"
            out = work / ("out" + (suffix if cfg["tool"].startswith(("packer", "pack")) else ""))
            full = {**cfg, "files": str(files), "samples": args.samples, "out": str(out),
                    "shard_mb": args.shard_mb}  # fmt: skip
            got = run_pass(full, log)
            assert got["samples"] == args.samples, (name, got)
            rate = args.samples / got["closed_s"]
            others = "?" if got["others_share"] is None else f"{got['others_share']:.2f}"
            when = "warm-up" if repeat < 0 else f"round {repeat + 1}"
            log(f"{when} {name:32} {rate:8,.0f} samples/s  cpu {got['cpu_s']:5.1f} s  "
                f"others {others}")  # fmt: skip
            if repeat >= 0:
                runs.setdefault(name, []).append(got)
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    for cfg in grid:
        got = summary(runs[f"{cfg['fn']} {label(cfg)}"], args.samples)
        rows.setdefault(cfg["fn"], {})[label(cfg)] = got
    medians = {fn: {k: r["samples_per_s"] for k, r in by.items()} for fn, by in rows.items()}
    checks = verdicts(medians, args.checks)
    print(table(rows))
    for v in checks:
        print(f"{v['measure']}: {v['ratio']:.2f} (target ≥ {v['target']}: "
              f"{'met' if v['met'] else 'missed'})")  # fmt: skip
    report = {
        **report_head("write_throughput", info, args),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        **run_costs(started, 0.0, load_before, os.getloadavg()),
        "medians": rows, "targets": checks,
        "runs": runs,
    }  # fmt: skip
    path = save_report(args.out / f"{args.name}.json", report)
    log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
