"""The benchmark scripts are thin parse_args() + main(args) over packer.bench and packer.diagnosis: run each, tiny.

Marked ``bench``: not part of ``make test`` (the suite's CPU budget), run by ``make bench-check``
(and by ``.ci/run`` after the suite)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from harness.plain_lmdb import PlainLMDBDataset
from torch.utils.data import DataLoader

import packer
from packer.errors import FormatError

pytestmark = pytest.mark.bench

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_read_throughput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("read_throughput")
    args = ["--data", str(tmp_path), "--images", "20", "--repeats", "1", "--workers", "0"]
    args += ["--caches", "warm", "--formats", "npy", "lmdb", "--modes", "bytes"]
    args += ["--wait-budget", "0", "--in-process", "--out", str(tmp_path)]
    assert script.main(script.parse_args(args)) == 0
    out = capsys.readouterr().out
    assert "| jpeg folder | bytes | 0 | warm | default |" in out and "| npy | bytes |" in out
    assert "| plain lmdb | bytes | 0 | warm | default |" in out
    report = json.loads((tmp_path / "read_throughput.json").read_text())
    names = {r["dataset"] for r in report["results"]}
    assert names == {"jpeg folder", "memory", "npy", "lmdb", "plain lmdb"}
    assert any(c["target"].startswith("lmdb: >= 1x plain") for c in report["targets"])
    head = ["benchmark", "date", "command", "machine", "options"]  # harness.record.report_head
    assert list(report)[:5] == head and report["benchmark"] == "read_throughput"
    assert report["options"]["data"] == str(tmp_path) and report["seconds_total"] > 0


def test_plain_lmdb_reads_what_packer_reads(packed: dict[str, Path]) -> None:
    """The plain py-lmdb baseline returns the same bytes and labels as packer's LMDBDataset, in
    any order and across shards, in this process and in DataLoader workers. (py-lmdb opens a
    file once per process, so each reader closes before the other opens.)"""
    root = packed[".lmdb"]
    assert len(json.loads((root / "packer.json").read_text())["shards"]) > 1
    ours = packer.LMDBDataset(root, output="bytes")
    expected = [ours[i] for i in range(len(ours))]
    ours.reader.close()
    decoded = packer.LMDBDataset(root, output="numpy")
    image = decoded[1][0]
    decoded.reader.close()
    plain = PlainLMDBDataset(root, output="bytes")
    n = len(expected)
    assert len(plain) == n
    assert [plain[i] for i in range(n)] == expected
    order = list(range(n))[::-2] + list(range(n))[::2]
    assert plain.__getitems__(order) == [expected[i] for i in order]
    loader = DataLoader(plain, batch_size=4, num_workers=2, collate_fn=list)
    assert [item for batch in loader for item in batch] == expected
    plain.close()
    plain_decoded = PlainLMDBDataset(root, output="numpy")
    assert np.array_equal(plain_decoded[1][0], image) and plain_decoded[1][1] == expected[1][1]
    plain_decoded.close()
    assert plain[0] == expected[0]  # reopens after close
    plain.close()
    with pytest.raises(FormatError):
        PlainLMDBDataset(packed[".npy"])


def test_bench_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("bench_formats")
    args = ["--data", str(tmp_path), "--images", "20", "--formats", ".npy", "--workers", "0"]
    args += ["--modes", "bytes", "--epochs", "1", "--json", str(tmp_path / "b.json")]
    assert script.main(script.parse_args(args)) == 0
    assert "| images.npy | bytes | 0 | warm |" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "b.json").read_text())["runs"]) == 2


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_bench_stall(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("bench_stall")
    args = ["--workers", "2", "--item-ms", "2", "--batch-size", "2", "--step-ms", "2"]
    assert (
        script.main(script.parse_args([*args, "--steps", "6", "--json", str(tmp_path / "s.json")]))
        == 0
    )
    assert "| 2 |" in capsys.readouterr().out


def test_video_clips(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("video_clips")
    args = ["--data", str(tmp_path), "--videos", "4", "--frames", "8,10", "--size", "64x48"]
    args += ["--batch", "2", "--repeats", "1", "--workers", "0", "--extras"]
    script.main(script.parse_args([*args, "--out", str(tmp_path / "v.json")]))
    out = capsys.readouterr().out
    assert "| npy whole-file |" in out and "| mp4 seek-decode |" in out
    assert "**bytes, cold cache**" in out and "cold bytes, disk ≤ 1.3× payload, npy:" in out
    rows = json.loads((tmp_path / "v.json").read_text())["rows"]
    for row in rows:
        assert row["disk_per_clip"] >= 0 and row["clips"] == 4
        assert row["dataset"] == "mp4 seek-decode" or row["payload_per_clip"] > 0


def test_sampler_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("sampler_reads")
    out = tmp_path / "sampler_reads.json"
    args = ["--data", str(tmp_path), "--images", "20", "--shard-size", "200kB", "--repeats", "1"]
    args += ["--workers", "0", "--caches", "warm", "cold", "--samplers", "random", "sharded"]
    assert script.main(script.parse_args([*args, "--out", str(out)])) == 0
    assert "| sharded | cold |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["shards"] > 1 and len(report["results"]) == 4
    assert (report["benchmark"], report["options"]["images"]) == ("sampler_reads", 20)


def test_bench_decoders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("bench_decoders")
    args = ["--images", "4", "--sizes", "96x64,480x360", "--crop", "32", "--repeats", "1"]
    assert script.main(script.parse_args([*args, "--json", str(tmp_path / "d.json")])) == 0
    out = capsys.readouterr().out
    for case in ("decode simplejpeg", "decode opencv", "fused RandomResizedCrop simplejpeg"):
        assert f"| {case} |" in out
    assert "decode pillow" in json.loads((tmp_path / "d.json").read_text())["images_per_s"]


def test_scale_convert(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("scale_convert")
    args = ["--data", str(tmp_path), "--images", "20", "--dask-workers", "0", "--profile"]
    args += ["--top", "3", "--out", str(tmp_path), "--repeats", "2", "--stages"]
    assert script.main(script.parse_args(args)) == 0
    out = capsys.readouterr().out
    assert "| tar cf |" in out and "| packer lmdb, --check fast |" in out
    assert "function calls" in out  # the profile
    assert "| check scan | pool |" in out and "| `--check scan` | 32 |" in out  # --stages
    report = json.loads((tmp_path / "scale_convert.json").read_text())
    assert [r["run"] for r in report["results"]][0] == "tar cf"
    assert [r["rounds"] for r in report["results"]] == [2, 2, 2]
    assert all(r["cpu_seconds"] > 0 for r in report["results"][1:])


def test_decode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("decode")
    args = ["--data", str(tmp_path), "--images", "10", "--large-images", "10"]
    args += ["--large-size", "96x72", "--crop", "32", "--repeats", "1", "--workers", "0"]
    args += ["--wait-budget", "0", "--in-process", "--out", str(tmp_path)]
    assert script.main(script.parse_args(args)) == 0
    out = capsys.readouterr().out
    assert "| 10×400x350 | baseline | folder | pillow | decode-then-crop | 0 |" in out
    assert "| 10×96x72 | fused fast | lmdb |" in out and "≥ 1.2× lmdb fast" in out
    report = json.loads((tmp_path / "decode.json").read_text())
    rows = {(r["variant"], r["name"]) for r in report["results"]}
    assert {("photos", "baseline"), ("large", "s256 fast"), ("large", "npy112")} <= rows
    for row in report["results"]:
        side = 112 if row["name"] == "npy112" else 32
        assert row["output_bytes_per_image"] == 3 * side * side and row["images"] > 0
    assert report["loadavg_before"] and report["machine"]["fast_decoders"]


def test_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("scale")
    out = tmp_path / "scale.json"
    args = ["--data", str(tmp_path / "d"), "--classes", "3", "--per-class", "20"]
    args += ["--workers", "2", "--batch-size", "8", "--convert-workers", "1", "--gc-freeze"]
    assert script.main(script.parse_args([*args, "--out", str(out)])) == 0
    assert "| open_dataset |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["samples"] == report["epoch"]["samples"] == 60
    assert report["open"]["index_bytes_per_sample"] > 0 and report["convert"]["peak_rss_mb"] > 0
    assert len(report["epoch"]["workers"]) == 2
    assert not (tmp_path / "d" / "tree").exists()  # deleted without --keep


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_state_dict_cost(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("state_dict_cost")
    out = tmp_path / "state_dict_cost.json"
    args = ["--data", str(tmp_path), "--images", "20", "--large", "300", "--batches", "3"]
    args += ["--batch-size", "4", "--repeats", "1", "--out", str(out)]
    assert script.main(script.parse_args(args)) == 0
    assert "| 300 | mixture | 320 |" in capsys.readouterr().out  # 300 + 20: the sampler row
    report = json.loads(out.read_text())
    assert len(report["results"]) == 12 and len(report["samplers"]) == 4
    assert all(r["state_bytes"] < 1000 for r in report["results"] if r["snapshot_every"])


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning")
def test_mixture_throughput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("mixture_throughput")
    out = tmp_path / "mixture_throughput.json"
    args = ["--data", str(tmp_path), "--images", "20", "--shard-size", "200kB", "--repeats", "1"]
    args += ["--epochs", "1", "--workers", "0", "--wait-budget", "0", "--out", str(out)]
    assert script.main(script.parse_args(args)) == 0
    assert "| cold |" in capsys.readouterr().out
    report = json.loads(out.read_text())
    passes = [p for r in report["results"] for k in r["passes"].values() for p in k]
    assert len(passes) == 4 and all(p["images"] == 40 for p in passes)


def test_layout_regression(packed: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("layout_regression")
    root = str(BENCHMARKS.parent)
    script.main(
        script.parse_args([str(packed[".lmdb"]), "--old", root, "--new", root, "--rounds", "1"])
    )
    out = capsys.readouterr().out
    assert "old: " in out and "images/s, open" in out and "new/old: reads" in out


def test_training_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _script("training_path")
    base = tmp_path / "baseline"  # another checkout: its rows must import it, not ./packer
    shutil.copytree(BENCHMARKS.parent / "packer", base / "packer")
    args = ["--images", "20", "--data", str(tmp_path), "--baseline", str(base), "--rounds", "1"]
    args += ["--workers", "1", "--start-delay", "1.5", "--out", str(tmp_path)]
    assert script.main(script.parse_args(args)) == 0
    out = capsys.readouterr().out
    assert "| checkout | one process | 1 processes at once | DataLoader(1) |" in out
    assert "loader / (workers × one): " in out and "(target ≥ 0.9: " in out
    report = json.loads((tmp_path / "training_path.json").read_text())
    assert {v["measure"] for v in report["verdicts"]} >= {"one / baseline one"}
    assert all(rate > 0 for rates in report["rates"].values() for rate in rates.values())


def test_training_peers_packer_pass(tmp_path: Path) -> None:
    """The packer rows of training_peers.py, and the peers' PIL transform (the peers themselves
    run in the benchmark venv of benchmarks/peers_env.sh)."""
    from PIL import Image

    from packer.demo.fields import make_caption_set

    script = _script("training_peers")
    make_caption_set(tmp_path / "files", 20, size=(300, 250), seed=0)
    out = packer.convert(tmp_path / "files", tmp_path / "p.lmdb", progress=False).dst
    got = script.one_pass({"reader": "packer.lmdb", "path": str(out), "seed": 0, "workers": 0})
    assert got["samples"] == 20 and got["seconds"] > 0
    image = script.crop_flip(Image.new("RGB", (300, 250), (10, 20, 30)))
    assert image.dtype == torch.uint8 and image.shape == (3, 224, 224)
    assert image[:, 0, 0].tolist() == [10, 20, 30]


def test_fields_read_packer_passes(tmp_path: Path) -> None:
    """The packer rows of fields_read.py: its collate and the list collate read every sample and
    every image byte (the peers' rows run in the benchmark venv of benchmarks/peers_env.sh)."""
    from packer.demo.fields import make_caption_set

    script = _script("fields_read")
    written = make_caption_set(tmp_path / "files", 20, size=(300, 250), seed=0)
    out = packer.convert(tmp_path / "files", tmp_path / "p.npy", progress=False).dst
    for reader in ("packer.npy", "packer.npy sharded", "packer.npy sharded list"):
        got = script.one_pass({
            "reader": reader, "path": str(out), "cache": "warm", "seed": 0, "workers": 1,
            "fields": ["jpg", "txt"],
        })  # fmt: skip
        assert got["samples"] == 20
        assert got["payload"] == sum(len(f["jpg"]) + 1 for f in written.values())


def test_transport(
    packed: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """transport.py side by side on a class dataset, and its pass over a dataset with fields."""
    from packer.demo.fields import make_caption_set

    make_caption_set(tmp_path / "files", 12, size=(200, 150), seed=0)
    fields = packer.convert(tmp_path / "files", tmp_path / "f.npy", progress=False).dst
    script = _script("transport")
    root = str(BENCHMARKS.parent)
    args = [str(packed[".npy"]), "--old", root, "--new", root, "--rounds", "1", "--epochs", "1"]
    report = script.main(script.parse_args([*args, "--workers", "1"]))
    assert report[str(packed[".npy"])]["old"] > 0 and report[str(packed[".npy"])]["new"] > 0
    assert "new/old" in capsys.readouterr().out
    assert script.one_pass(root, str(fields), workers=1, epochs=1) > 0


def test_write_throughput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """write_throughput.py: packer's passes write and verify every sample, a changed byte is
    caught by the verification, and a tiny run reports the pack ratio (the peers' passes run
    in the benchmark venv of benchmarks/peers_env.sh)."""
    script = _script("write_throughput")
    files = script.photos(tmp_path, 12)
    base = {"files": str(files), "samples": 12, "workers": 1, "shard_mb": 1}
    for tool, fn in (("packer.Writer .npy", "copy"), ("packer.Writer .lmdb", "resize")):
        out = tmp_path / ("o.npy" if tool.endswith("npy") else "o.lmdb")
        got = script.one_pass({**base, "tool": tool, "fn": fn, "out": str(out)})
        assert got["samples"] == 12 and got["closed_s"] > 0 and not out.exists()
    out, script._FN = tmp_path / "kept.lmdb", "copy"
    script.write("packer.Writer .lmdb", out, 1, 1)
    assert script.verify("packer.Writer .lmdb", out, "copy") == 12
    script._SAMPLES[5] = {**script._SAMPLES[5], "txt": script._SAMPLES[5]["txt"] + "!"}
    with pytest.raises(AssertionError, match="sample 000005 differs"):
        script.verify("packer.Writer .lmdb", out, "copy")
    args = ["--samples", "12", "--root", str(tmp_path), "--tools", "pack", "--fns", "resize"]
    args += ["--repeats", "1", "--no-warmup", "--shard-mb", "1", "--out", str(tmp_path)]
    assert script.main(script.parse_args(args)) == 0
    assert "| resize | pack(workers=2) |" in capsys.readouterr().out
    report = json.loads((tmp_path / "write_throughput.json").read_text())
    assert list(report)[:5] == ["benchmark", "date", "command", "machine", "options"]
    assert [t["measure"] for t in report["targets"]] == [
        "pack(workers=2) / pack(workers=1) (resize)"
    ]
    assert all(r[0]["samples"] == 12 for r in report["runs"].values())
