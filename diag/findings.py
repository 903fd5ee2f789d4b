"""Finding, Severity, Location: what a check says about a run.

A finding is plain data (JSON-serialisable through :meth:`Finding.to_dict`).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"
    PASS = "pass"
    SKIPPED = "skipped"   # the check could not judge this run; `message` says why
    CRASHED = "crashed"   # the check itself raised; `message` holds the error

    @property
    def rank(self) -> int:
        """Order used for sorting and for --fail-on. A crashed check ranks with errors:
        a broken check must not let CI pass silently."""
        return _RANK[self]

    @classmethod
    def parse(cls, value: str) -> "Severity":
        try:
            return cls(value.lower())
        except ValueError:
            names = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown severity {value!r} (one of: {names})") from None


def count_phrase(severity: "Severity", n: int) -> str:
    """How many findings of a severity, in words: "1 error", "4 warnings", "5 passed", "22 skipped",
    "2 info", "1 crashed" (the one wording for every summary line)."""
    word = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "info",
            Severity.PASS: "passed", Severity.SKIPPED: "skipped", Severity.CRASHED: "crashed"}[severity]
    if n != 1 and severity in (Severity.ERROR, Severity.WARNING):
        word += "s"
    return f"{n} {word}"


_RANK = {
    Severity.CRASHED: 4,
    Severity.ERROR: 3,
    Severity.WARNING: 2,
    Severity.INFO: 1,
    Severity.PASS: 0,
    Severity.SKIPPED: -1,
}

# --fail-on levels: a run fails when any finding ranks at or above the level.
FAIL_ON_LEVELS = {"error": 3, "warning": 2, "info": 1, "never": 99}


@dataclass
class Location:
    file: str
    line: int | None = None
    function: str | None = None

    def __str__(self) -> str:
        s = self.file
        if self.line is not None:
            s += f":{self.line}"
        if self.function:
            s += f" (in {self.function})"
        return s

    @classmethod
    def from_dict(cls, d: dict | None) -> "Location | None":
        if not d:
            return None
        return cls(file=d.get("file", "?"), line=d.get("line"), function=d.get("function"))


@dataclass
class Finding:
    id: str                       # stable, dotted: "dataloader.workers"
    severity: Severity
    title: str                    # short, for lists
    message: str                  # one sentence with the measured numbers
    evidence: dict[str, Any] = field(default_factory=dict)  # the numbers behind the message
    why: str | None = None        # why it matters
    fix: str | None = None        # what to change
    snippet: str | None = None    # a short code snippet for the fix
    location: Location | None = None
    docs: str | None = None       # a link to the source of the rule
    check: str | None = None      # the check that produced it (defaults to id)
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if isinstance(self.severity, str) and not isinstance(self.severity, Severity):
            self.severity = Severity(self.severity)
        if isinstance(self.location, dict):
            self.location = Location.from_dict(self.location)
        if self.check is None:
            self.check = self.id

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.value
        d["location"] = asdict(self.location) if self.location else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Finding":
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first, then by id."""
    return sorted(findings, key=lambda f: (-f.severity.rank, f.id))


def worst(findings: list[Finding]) -> Severity | None:
    ranked = [f for f in findings if f.severity is not Severity.SKIPPED]
    if not ranked:
        return None
    return max(ranked, key=lambda f: f.severity.rank).severity
