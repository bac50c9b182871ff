"""packer doctor: bounded measurements on a tiny dataset, the diagnosis and the CLI command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.errors import PackerError
from packer.tools.commands import doctor as doctor_command
from packer.tools.doctor import _batch_ms, doctor, measure_split, spread_indices
from packer.tools.image_demo import make_image_tree
from packer.tools.stalls import HEADROOM, recommend_workers


def test_doctor_on_a_folder(clean: dict[str, Path]) -> None:
    report = doctor(clean["folder"], step_ms=50, batch_size=4, workers=2, budget_s=30)
    assert report.format == "folder" and report.samples == 12 and report.dataset_bytes > 0
    assert report.disk.samples == 12 and report.disk.warm_s > 0 and report.disk.bytes > 0
    assert set(report.split_ms) == {"read", "decode", "transform"}
    assert all(v > 0 for v in report.split_ms.values())
    assert report.cpus >= 1 and report.worker_threads.torch_threads >= 1
    assert report.loader is not None and report.loader.num_workers == 2
    fits_ram = True  # 12 tiny JPEGs
    expected = recommend_workers(_batch_ms(report, fits_ram) / 1e3, 0.05, HEADROOM)
    assert report.workers_needed == {50: expected}
    assert report.convert_command is not None
    assert report.convert_command.startswith(f"packer convert {clean['folder']} ")
    assert ".lmdb" in report.convert_command
    text = str(report)
    for part in ("disk:", "cold (evicted", "warm (page cache)", "decode", "findings:"):
        assert part in text
    assert f"step 50 ms: num_workers={expected}" in text
    assert json.loads(json.dumps(report.to_dict(), default=str))["samples"] == 12


def test_doctor_on_a_packed_output_without_step(clean: dict[str, Path]) -> None:
    report = doctor(clean[".lmdb"], batch_size=4, workers=0, budget_s=30)
    assert report.format == "lmdb" and report.convert_command is None
    assert sorted(report.workers_needed) == [50, 100, 200]
    assert "persistent_workers=True" in str(report)


def test_split_and_spread() -> None:
    assert spread_indices(100, 5) == [0, 25, 50, 74, 99]
    assert spread_indices(3, 10) == [0, 1, 2]


def test_measure_split_fields(clean: dict[str, Path]) -> None:
    split = measure_split(clean[".lmdb"], [0, 5, 11], time_limit_s=10)
    assert set(split) == {"read", "decode", "transform"} and min(split.values()) > 0


def test_doctor_bad_input(clean: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(PackerError):
        doctor(tmp_path / "missing")
    with pytest.raises(PackerError):
        doctor(clean["folder"], budget_s=0)


def test_cli_doctor_prints_a_diagnosis(clean: dict[str, Path]) -> None:
    args = [str(clean["folder"]), "--batch-size", "4", "--workers", "2", "--step-ms", "40"]
    result = CliRunner().invoke(doctor_command, args)
    assert result.exit_code == 0, result.output
    assert "packer doctor:" in result.output and "recommendation:" in result.output
    assert "packer convert" in result.output


def test_cli_doctor_needs_path_or_loader(tmp_path: Path) -> None:
    assert CliRunner().invoke(doctor_command, []).exit_code == 2
    result = CliRunner().invoke(doctor_command, [str(tmp_path / "nothing")])
    assert result.exit_code == 1 and "nothing" in result.output


def test_doctor_reports_broken_files_instead_of_crashing(tmp_path: Path) -> None:
    tree = make_image_tree(tmp_path / "broken", classes=2, per_class=3, size=(64, 48), bad=2)
    report = doctor(tree.root, step_ms=50, batch_size=2, workers=0, budget_s=20)
    assert len(report.broken) == 2
    assert "broken_000.JPEG" in report.broken[0]
    assert any("cannot be decoded" in f for f in report.findings)
    assert "cannot be decoded" in str(report)


def test_decode_advice_names_the_decoder_and_the_resize_command(tmp_path: Path) -> None:
    import io

    import numpy as np

    from packer.tools.decode_advice import decode_advice
    from packer.tools.image_demo import photo_like

    rng = np.random.default_rng(0)
    samples = []
    for _ in range(6):
        out = io.BytesIO()
        photo_like(rng, 500, 375).save(out, format="JPEG", quality=90)
        samples.append(out.getvalue())
    samples.append(b"\xff\xd8\xff\xe0 truncated")  # a broken sample is left out, not a crash
    advice = decode_advice(samples, "/data/imagenet/train", "train.lmdb")
    assert set(advice.ms) >= {"pillow", "simplejpeg", "opencv"}
    assert advice.short_side == 375
    text = "\n".join(advice.findings + advice.recommendations)
    assert "JPEG decode per sample: Pillow" in text and "decoder='auto' uses" in text
    assert "packer convert /data/imagenet/train train-256.lmdb --short-side 256" in text
    assert "~2.1× fewer pixels" in text  # (375 / 256) ** 2
    small = decode_advice([_small_jpeg()], None, "x.lmdb")
    assert not any("--short-side" in r for r in small.recommendations)


def _small_jpeg() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (200, 150), (10, 20, 30)).save(out, format="JPEG")
    return out.getvalue()
