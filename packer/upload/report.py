"""What an upload (:mod:`packer.upload.uploader`) reports: its one-line summary, and the bytes sent
counted on a progress bar (an attempt that fails takes its bytes back)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Sent", "UploadReport", "progress_bar"]


@dataclass
class UploadReport:
    """What an upload did: objects sent, skipped (already there), deleted (stale), bytes."""

    url: str
    uploaded: int = 0
    skipped: int = 0
    removed: int = 0
    streamed: int = 0  # of ``uploaded``: sent while the conversion ran ...
    streamed_bytes: int = 0  # ... with these bytes (``seconds`` is the time after it)
    bytes: int = 0
    seconds: float = 0.0

    def summary(self) -> str:
        from packer.core.sizes import format_size

        rate = (self.bytes - self.streamed_bytes) / self.seconds if self.seconds > 0 else 0.0
        line = f"uploaded {self.uploaded} object(s), {format_size(self.bytes)}, to {self.url}"
        if self.streamed:
            line += f": {self.streamed} while converting, the rest"
        line += f" in {self.seconds:.1f} s ({format_size(rate)}/s), the manifest last"
        if self.skipped:
            line += f"; {self.skipped} already uploaded (resumed)"
        return line + (
            f"; {self.removed} stale object(s) of the old output deleted" * bool(self.removed)
        )


class Sent:
    """The bytes of one attempt counted on the progress bar, taken back if it fails."""

    def __init__(self, bar: Any) -> None:
        self.bar, self.count = bar, 0

    def callback(self) -> Any:
        from fsspec.callbacks import Callback

        sent = self

        class Counted(Callback):
            def call(self, *args: Any, **kwargs: Any) -> None:
                pass

            def relative_update(self, inc: int = 1) -> None:
                sent.count += inc
                sent.bar.update(inc)

        return Counted()

    def undo(self) -> None:
        if self.count:
            self.bar.update(-self.count)
            self.count = 0


def progress_bar(total: int, progress: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc="upload",
        disable=not progress,
    )
