"""The text of ``packer doctor``: measurements first, then findings and recommendations.

Kept apart from :mod:`packer.diagnosis.doctor` (which measures) so each stays small; it reads a
``DoctorReport`` by its attributes and imports nothing of the doctor.
"""

from __future__ import annotations

from typing import Any

from packer.core.sizes import format_size

__all__ = ["render"]


def _rate_line(name: str, disk: Any, seconds: float | None) -> str:
    mb_s, files_s = disk.rates(seconds)
    per = 1e3 * seconds / max(1, disk.samples) if seconds else 0.0
    return f"  {name:<34} {mb_s:>9,.1f} MB/s {files_s:>9,.0f} files/s  ({per:.2f} ms per sample)"


def render(report: Any) -> str:
    """The diagnosis as text: measurements first, then findings and recommendations."""
    r, disk, split = report, report.disk, report.split_ms
    resident = (
        "" if disk.resident_before is None else f", {100 * disk.resident_before:.0f} % resident"
    )
    lines = [
        f"packer doctor: {r.path} ({r.format}, {r.samples:,} samples, "
        f"≈ {format_size(r.dataset_bytes)}), batch {r.batch_size}, {r.cpus} CPUs, "
        f"measured in {r.elapsed_s:.1f} s",
        "",
        f"disk: {disk.samples} samples spread over the dataset, read one by one",
    ]
    if disk.cold_s is not None:
        lines.append(_rate_line(f"cold (evicted{resident}):", disk, disk.cold_s))
    else:
        lines.append("  cold: not measured (no posix_fadvise on this platform)")
    lines += [
        _rate_line("warm (page cache):", disk, disk.warm_s),
        "",
        "per sample in one process (medians): "
        + f"read {split['read']:.2f} ms warm"
        + (f" / {r.cold_read_ms:.2f} ms cold" if r.cold_read_ms is not None else "")
        + f" | decode {split['decode']:.2f} ms | transform {split['transform']:.2f} ms",
    ]
    t = r.worker_threads
    lines.append(
        f"threads in a DataLoader worker: torch {t.torch_threads}, "
        f"OMP_NUM_THREADS={t.env.get('OMP_NUM_THREADS') or 'unset'}, "
        f"MKL_NUM_THREADS={t.env.get('MKL_NUM_THREADS') or 'unset'}, "
        f"OpenCV {t.opencv_threads if t.opencv_threads is not None else 'not loaded'}, "
        f"{t.os_threads} OS threads after one sample; {t.cpus} CPUs"
    )
    if r.loader is not None:
        lines += ["", "a DataLoader with the standard transform (RandomResizedCrop 224 + flip):"]
        lines += ["  " + line for line in r.loader.measurements()]
    lines += ["", "findings:"] + [f"  - {f}" for f in r.findings]
    lines += ["", "recommendation:"] + [f"  - {x}" for x in r.recommendations]
    return "\n".join(lines)
