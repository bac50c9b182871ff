"""What a conversion did: :class:`ConvertResult`, the summary ``packer convert`` prints (text or
``--json``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.core.manifest import Manifest
from packer.core.sizes import format_size
from packer.source.images import SkippedInput

__all__ = ["ConvertResult"]


@dataclass
class ConvertResult:
    """What a conversion did: the manifest written and the numbers for the summary."""

    dst: Path | str  # a URL when the output was uploaded
    manifest: Manifest
    seconds: float
    bytes_in: int
    bytes_out: int
    skipped: list[SkippedInput] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    class_index: dict[str, Any] = field(default_factory=dict)  # where the index came from
    warnings: list[dict[str, str]] = field(default_factory=list)  # {"code", "message"}

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable summary (``packer convert --json``): what :meth:`summary` says."""
        m = self.manifest
        return {
            "ok": True,
            "dst": str(self.dst),
            "format": m.format,
            "kind": m.kind,
            "samples": m.num_samples,
            "classes": len(m.classes),
            "splits": dict(m.opts.splits) if m.kind == "splits" else None,
            "files": len(m.shards) or m.num_samples,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "seconds": round(self.seconds, 3),
            "storage": dict(m.opts.storage),
            "notes": self.notes,
            "class_index": self.class_index,
            "warnings": self.warnings,
            "skipped": [{"path": s.path, "reason": s.reason} for s in self.skipped],
        }

    def summary(self) -> str:
        """A few human-readable lines: counts, sizes, time, skipped inputs."""
        m = self.manifest
        rate = self.bytes_in / self.seconds if self.seconds > 0 else 0.0
        what = "videos" if m.kind == "video" else "samples"
        files = (
            f"{len(m.opts.splits)} splits"
            if m.kind == "splits"
            else f"{len(m.shards) or m.num_samples} file(s)"
        )
        held = (
            f"{len(m.opts.fields)} fields"
            if m.kind == "fields"
            else f"{len(m.classes)} class{'' if len(m.classes) == 1 else 'es'}"
        )
        lines = [
            f"wrote {self.dst} ({m.format}): {m.num_samples} {what}, {held}, {files}",
            f"read {format_size(self.bytes_in)}, wrote {format_size(self.bytes_out)} "
            f"in {self.seconds:.1f} s ({format_size(rate)}/s)",
        ]
        storage = m.opts.storage
        if m.kind == "video":
            lines.append(
                f"frames: {storage.get('frames', 0)} (mean {storage.get('mean_frames', 0):.1f}, "
                f"max {storage.get('max_frames', 0)} per video); padding overhead "
                f"{storage.get('padding_overhead', 1.0):.3f}× (bytes on disk / bytes of frames)"
            )
        lines += self.notes
        if self.class_index.get("source") in ("splits", "given", "labels-file"):
            lines.append(f"class index: {self.class_index['detail']}")
        lines += [w["message"] for w in self.warnings]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} input(s) (listed in the manifest):")
            lines += [f"  {s.path}: {s.reason}" for s in self.skipped[:10]]
            if len(self.skipped) > 10:
                lines.append(f"  ... and {len(self.skipped) - 10} more (packer inspect --skipped)")
        return "\n".join(lines)
