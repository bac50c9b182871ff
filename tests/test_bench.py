"""packer bench: throughput runs, per-batch waits, per-sample storage counters, the CLI command."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from packer.bench.bench import BenchSpec, check_paths, run_bench
from packer.bench.storage_cost import measure_storage
from packer.cli.measure import bench
from packer.diagnosis.io_counters import io_available, resident_fraction
from packer.diagnosis.targets import bench_collate, evict_page_cache, open_for_mode
from packer.errors import PackerError

SAMPLES = 12
BATCH = 4


def default_sigint() -> None:
    """A test runner started in the background (``cmd &``) ignores SIGINT, and so would the
    child it starts: give the child Python's ordinary Ctrl-C back."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _fstype(path: Path) -> str:
    best, fstype = "", ""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            mount, kind = fields[4], fields[fields.index("-") + 1]
            if str(path).startswith(mount) and len(mount) >= len(best):
                best, fstype = mount, kind
    return fstype


def test_run_bench_returns_documented_fields(clean: dict[str, Path]) -> None:
    spec = BenchSpec(workers=(0, 2), modes=("bytes",), batch_size=BATCH, warmup=0)
    runs = list(run_bench([clean["folder"], clean[".lmdb"]], spec))
    assert [(r.label, r.workers) for r in runs] == [
        ("images", 0), ("images.lmdb", 0), ("images", 2), ("images.lmdb", 2)
    ]  # fmt: skip
    stored = sum(p.stat().st_size for p in clean["folder"].rglob("*.JPEG"))
    for run in runs:
        assert run.images == SAMPLES and run.bytes == stored
        assert run.seconds > 0 and run.images_per_s > 0 and run.mb_per_s > 0
        assert len(run.waits) == math.ceil(SAMPLES / BATCH) and min(run.waits) >= 0
        assert run.resident_before is None or 0.0 <= run.resident_before <= 1.0
        row = run.to_dict()
        assert {"images_per_s", "mb_per_s", "wait", "stall", "ratio"} <= set(row)
        assert row["wait"]["max_ms"] >= row["wait"]["p95_ms"] >= row["wait"]["p50_ms"] >= 0
    assert runs[0].ratio == 1.0 and runs[2].ratio == 1.0  # the first path is the baseline
    assert runs[1].ratio == pytest.approx(runs[1].images_per_s / runs[0].images_per_s)


def test_cold_epochs_limit_and_step(clean: dict[str, Path]) -> None:
    spec = BenchSpec(workers=(0,), batch_size=BATCH, epochs=2, cold=True, limit=5, step_ms=1)
    (run,) = run_bench([clean[".npy"]], spec)
    assert run.cache == "cold" and run.images == 10 and len(run.epoch_seconds) == 2
    assert len(run.waits) == 2 * math.ceil(5 / BATCH)
    assert run.seconds >= 4 * 1e-3  # four simulated steps of 1 ms


def test_eviction_takes_effect(clean: dict[str, Path]) -> None:
    files = sorted(clean["folder"].rglob("*.JPEG"))
    for path in files:
        path.read_bytes()
    if _fstype(files[0]) in {"tmpfs", "ramfs"}:
        pytest.skip("a RAM filesystem has no page cache to evict")
    assert resident_fraction(files) == 1.0
    assert evict_page_cache(files) == len(files)
    assert resident_fraction(files) == 0.0


def test_transform_mode_gives_224_crops(clean: dict[str, Path]) -> None:
    dataset = open_for_mode(clean[".lmdb"], "transform")
    batch = bench_collate([dataset[i] for i in range(3)])
    assert isinstance(batch[0], torch.Tensor) and tuple(batch[0].shape) == (3, 224, 224, 3)
    assert batch[1].tolist() == [int(dataset.targets[i]) for i in range(3)]
    data, offsets, labels = bench_collate([open_for_mode(clean["folder"], "bytes")[0]])
    assert int(offsets[-1]) == data.numel() > 0 and labels.tolist() == [0]


@pytest.mark.skipif(not io_available(), reason="needs /proc/<pid>/io")
def test_storage_counters_fewer_opens_and_reads_when_packed(clean: dict[str, Path]) -> None:
    costs = {name: measure_storage(path, batch_size=BATCH) for name, path in clean.items()}
    folder = costs["folder"].per_sample()
    assert costs["folder"].samples == SAMPLES
    assert folder["opens"] >= 1.0 and folder["read_syscalls"] >= 1.0
    for name in (".lmdb", ".npy"):
        packed = costs[name].per_sample()
        assert packed["opens"] < folder["opens"], name
        assert packed["read_syscalls"] < folder["read_syscalls"], name
        assert packed["stored_bytes"] == folder["stored_bytes"]  # the same JPEG bytes
        assert costs[name].to_dict()["per_sample"] == packed


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    for bad in (tmp_path / "missing", tmp_path / "file.txt", tmp_path / "empty"):
        with pytest.raises(PackerError):
            check_paths([bad])
    with pytest.raises(PackerError, match="mode"):
        open_for_mode(tmp_path, "fast")
    with pytest.raises(PackerError, match="workers"):
        BenchSpec(workers=(-1,)).validate()


def test_cli_bench_prints_tables_and_writes_json_and_plot(
    clean: dict[str, Path], tmp_path: Path
) -> None:
    out_json, out_png = tmp_path / "b.json", tmp_path / "b.png"
    args = [str(clean["folder"]), str(clean[".lmdb"]), "--workers", "0,2", "--batch-size", "4"]
    result = CliRunner().invoke(bench, args + ["--json-out", str(out_json), "--plot", str(out_png)])
    assert result.exit_code == 0, result.output
    assert "| dataset | mode | workers |" in result.output
    assert "| files opened | read syscalls |" in result.output
    assert "| images.lmdb | bytes | 2 | warm |" in result.output
    data = json.loads(out_json.read_text())
    assert len(data["runs"]) == 4 and data["complete"] and data["machine"]["cpus"] >= 1
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_cli_bench_json_is_a_flag_printing_json(clean: dict[str, Path], tmp_path: Path) -> None:
    args = ["--workers", "0", "--batch-size", "4", "--no-storage", "--warmup", "0"]
    # --json right before the PATH: the flag takes no value, the path stays a PATH
    result = CliRunner().invoke(bench, ["--json", str(clean[".lmdb"]), *args])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # stdout is the JSON alone; progress went to stderr
    assert [r["label"] for r in data["runs"]] == ["images.lmdb"] and data["complete"]
    result = CliRunner().invoke(bench, [str(clean[".lmdb"]), *args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["runs"][0]["workers"] == 0
    old = tmp_path / "old.json"
    result = CliRunner().invoke(bench, [str(clean[".lmdb"]), *args, "--json", str(old)])
    assert result.exit_code == 0, result.output
    assert "deprecated" in result.stderr and "| dataset | mode |" in result.stdout
    assert len(json.loads(old.read_text())["runs"]) == 1


def test_plot_has_a_log_axis_so_slow_rows_are_visible(
    clean: dict[str, Path], tmp_path: Path
) -> None:
    from packer.bench.bench_report import plot_runs

    spec = BenchSpec(workers=(0,), modes=("bytes", "decode"), batch_size=BATCH, warmup=0)
    runs = list(run_bench([clean[".lmdb"]], spec))
    assert {r.mode for r in runs} == {"bytes", "decode"}
    png = tmp_path / "p.png"
    fig = plot_runs(png, runs)
    assert png.read_bytes()[:4] == b"\x89PNG"
    (ax,) = fig.axes
    assert ax.get_yscale() == "log"
    low, high = ax.get_ylim()
    rates = [r.images_per_s for r in runs]
    assert 0 < low <= min(rates) and max(rates) <= high  # every row inside the axis


def test_cli_bench_bad_input(tmp_path: Path) -> None:
    result = CliRunner().invoke(bench, [str(tmp_path / "nope")])
    assert result.exit_code == 1 and "does not exist" in result.output
    result = CliRunner().invoke(bench, [str(tmp_path), "--workers", "a,b"])
    assert result.exit_code == 1 and "--workers" in result.output


def test_ctrl_c_prints_what_was_measured(clean: dict[str, Path]) -> None:
    code = "import sys; from packer.cli.measure import bench; bench.main(sys.argv[1:])"
    args = [str(clean["folder"]), "--workers", "0", "--mode", "bytes,decode,transform"]
    # one batch per run, then a 2 s step: the SIGINT below always lands inside run 2, however
    # loaded the machine is
    args += ["--batch-size", "4", "--limit", "4", "--step-ms", "2000", "--no-storage"]
    args += ["--warmup", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        preexec_fn=default_sigint,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert line.startswith("[1/3]"), line
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted: 1 of 3 runs measured" in err
    assert "| images | bytes | 0 | warm |" in out and "| decode |" not in out


# REGISTRATION: fails until packer/cli.py registers the commands
# (`from packer.cli.measure import bench, doctor; main.add_command(bench); main.add_command(doctor)`).
def test_packer_help_lists_bench_and_doctor() -> None:
    from packer.cli.app import main

    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "bench" in result.output and "doctor" in result.output


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from packer.demo.video import make_video_tree
    from packer.write.convert import convert_video

    root = tmp_path_factory.mktemp("vbench")
    tree = make_video_tree(root / "frames", classes=2, per_class=2, frames=(10, 14))
    out = {"folder": tree.root}
    for suffix in (".npy", ".lmdb", ".h5"):
        out[suffix] = convert_video(tree.root, root / f"frames{suffix}", progress=False).dst
    return out


@pytest.mark.skipif(not io_available(), reason="needs /proc/<pid>/io")
def test_storage_cost_of_video_clips_has_disk_and_payload_per_clip(
    clips: dict[str, Path],
) -> None:
    for name, path in clips.items():
        cost = measure_storage(path, batch_size=2)
        per = cost.per_sample()
        assert cost.unit == "clip" and cost.samples == 4, name
        assert per["storage_bytes"] >= 0 and per["payload_bytes"] > 0, name
        # 8 frames of a 10-14 frame video: less than the whole video, the same for every format
        assert per["payload_bytes"] < per["stored_bytes"], name
        assert cost.to_dict()["per_sample"]["disk_per_payload"] >= 0
    payloads = {measure_storage(p, batch_size=2).payload_bytes for p in clips.values()}
    assert len(payloads) == 1


@pytest.mark.skipif(not io_available(), reason="needs /proc/<pid>/io")
def test_cli_bench_on_video_shows_disk_bytes_next_to_payload(clips: dict[str, Path]) -> None:
    args = [str(clips["folder"]), str(clips[".npy"]), str(clips[".lmdb"]), "--workers", "0"]
    result = CliRunner().invoke(bench, args + ["--batch-size", "2", "--cold", "--warmup", "0"])
    assert result.exit_code == 0, result.output
    assert "| storage KB | payload KB | storage ÷ payload |" in result.output
    rows = [line for line in result.output.splitlines() if "4 clips" in line]
    assert len(rows) == 3, result.output
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        disk, payload = float(cells[5]), float(cells[6])
        assert disk >= 0 and payload > 0


def test_cli_bench_decoder_and_a_resized_copy_side_by_side(
    clean: dict[str, Path], tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from packer.cli.app import main

    args = ["bench", str(clean[".lmdb"]), "--mode", "decode", "--workers", "0", "--warmup", "0"]
    args += ["--decoder", "opencv", "--short-side", "32", "--no-storage", "--limit", "6"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| images")]
    assert [r.split("|")[1].strip() for r in rows] == ["images.lmdb", "images@32.lmdb"]
    from packer.bench.resized_copy import resized_copy

    copy = resized_copy(clean[".lmdb"], 32, 6, tmp_path)  # what the second row read
    small = open_for_mode(copy, "decode")
    assert len(small) == 6 and {small[i][0].shape for i in range(6)} == {(32, 43, 3)}
    bad = CliRunner().invoke(main, ["bench", str(clean[".lmdb"]), "--decoder", "nope"])
    assert bad.exit_code != 0 and "unknown decoder 'nope'" in bad.output


def test_markdown_table_aligns_each_column_and_refuses_a_ragged_row() -> None:
    """The one table renderer of bench and benchmarks/harness: a rule cell per column, ``--:``
    for right-aligned ones; a row or an alignment of the wrong width is a ValueError."""
    from packer.bench.bench_report import markdown_table

    text = markdown_table(["name", "n"], "lr", [["a", 1], ("b", "2.0×")])
    assert text.splitlines() == ["| name | n |", "|---|--:|", "| a | 1 |", "| b | 2.0× |"]
    with pytest.raises(ValueError, match="3 cells in a table of 2 columns"):
        markdown_table(["name", "n"], "lr", [["a", 1, 2]])
    with pytest.raises(ValueError, match="one l or r for each of 2 columns"):
        markdown_table(["name", "n"], "lrr", [])
