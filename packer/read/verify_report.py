"""What ``verify`` found: a :class:`Problem` each, gathered in a :class:`VerifyReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Problem", "VerifyReport"]


@dataclass(frozen=True)
class Problem:
    """One thing wrong: where (file, and sample key when known) and what."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass
class VerifyReport:
    """What ``verify`` checked and found."""

    root: Path
    files_checked: int = 0
    samples_checked: int = 0
    decoded: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """The machine-readable result (``packer verify --json``)."""
        return {
            "path": str(self.root),
            "ok": self.ok,
            "files_checked": self.files_checked,
            "samples_checked": self.samples_checked,
            "decoded": self.decoded,
            "problems": [{"where": p.where, "what": p.what} for p in self.problems],
        }

    def summary(self) -> str:
        """Human-readable result, one line per problem."""
        head = (
            f"{self.root}: checked {self.files_checked} file(s), {self.samples_checked} sample(s)"
        )
        head += f", decoded {self.decoded}" if self.decoded else ""
        if self.ok:
            return head + ": OK"
        return "\n".join([head + f": {len(self.problems)} problem(s)", *map(str, self.problems)])
