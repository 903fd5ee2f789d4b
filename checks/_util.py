"""Small helpers shared by the built-in checks (pure Python)."""
from __future__ import annotations

from diag.findings import Finding, Location, Severity

TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"


def pct(x: float) -> str:
    return f"{100 * x:.0f}%" if x >= 0.01 else f"{100 * x:.1f}%"


def ms(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{1000 * seconds:.1f} ms"


def gib(n: float | None) -> str:
    if n is None:
        return "N/A"
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.0f} MiB"


def loc(d: dict | None) -> Location | None:
    return Location.from_dict(d)


def skipped(id: str, title: str, reason: str, **evidence) -> Finding:
    return Finding(id=id, severity=Severity.SKIPPED, title=title, message=reason, evidence=evidence)


def passed(id: str, title: str, message: str, **evidence) -> Finding:
    return Finding(id=id, severity=Severity.PASS, title=title, message=message, evidence=evidence)


def has_steps(ev) -> bool:
    return any(r.step_stats.count > 0 for r in ev.ranks)
