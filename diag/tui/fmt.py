"""Formatting helpers for the TUI panes (pure functions: no textual, easy to test)."""
from __future__ import annotations

import re

import math
from typing import Any

from diag import units
from diag.report import fmt_value  # noqa: F401  (re-exported for the panes)

NA = "N/A"

BLOCKS = " ▏▎▍▌▋▊▉█"


def is_na(v: Any) -> bool:
    """True for a value a provider could not give (None, NaN, or an ``NA`` sentinel object)."""
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    if isinstance(v, (int, float)):
        return False
    return type(v).__name__ in ("NAType", "_NA", "NA") or repr(v) in ("NA", "N/A")


def num(v: Any, spec: str = ".0f", unit: str = "") -> str:
    if is_na(v):
        return NA
    try:
        return f"{v:{spec}}{unit}"
    except (TypeError, ValueError):
        return str(v)


def ms(seconds: float | None) -> str:
    if is_na(seconds):
        return NA
    return units.fmt_seconds(seconds, fine=True)


def duration(seconds: float | None) -> str:
    """12.3 s, 4 min 05 s, 2 h 03 min, 3.2 days."""
    if is_na(seconds):
        return NA
    s = float(seconds)
    if s < 1:
        return ms(s)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    if s < 48 * 3600:
        return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
    return f"{s / 86400:.1f} days"


def nbytes(n: float | None) -> str:
    if is_na(n):
        return NA
    return units.fmt_bytes(n, style="short")


def si(v: float | None, unit: str = "") -> str:
    """1.2k, 3.4M, 5.6G ... with an optional unit."""
    if is_na(v):
        return NA
    v = float(v)
    for suffix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= size:
            x = v / size
            return f"{x:.3g}{suffix}{unit}" if x < 1000 else f"{x:.0f}{suffix}{unit}"
    if v == int(v):
        return f"{int(v)}{unit}"
    return f"{v:.3g}{unit}"


def money(v: float | None) -> str:
    if is_na(v):
        return NA
    if v >= 100:
        return f"${v:,.0f}"
    return f"${v:,.2f}"


def pct(share: float | None, digits: int = 0) -> str:
    if is_na(share):
        return NA
    return units.fmt_pct(share, digits=digits)


def bar(share: float | None, width: int) -> str:
    """A horizontal bar of `width` cells filled to `share` (0..1), with eighth-cell precision."""
    if width <= 0:
        return ""
    if is_na(share):
        return "·" * width
    share = min(max(float(share), 0.0), 1.0)
    eighths = int(round(share * width * 8))
    full, rest = divmod(eighths, 8)
    s = "█" * full
    if rest and full < width:
        s += BLOCKS[rest]
    return s.ljust(width)


def shorten(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    return text[: width - 1] + "…"


def short_path(path: str | None, cwd: str | None = None) -> str:
    """``path`` relative to ``cwd`` when it lies inside it (shorter, and the same wherever the
    checkout is), else unchanged."""
    if not path:
        return ""
    if cwd and path.startswith(cwd.rstrip("/") + "/"):
        return path[len(cwd.rstrip("/")) + 1:]
    return path




def wrap_path(path: str, width: int) -> list[str]:
    """A path cut into lines of at most ``width`` characters after a "/" (never inside a name, unless one
    name alone is longer than the line)."""
    lines: list[str] = []
    cur = ""
    for part in re.split(r"(?<=/)", path):
        if cur and len(cur) + len(part) > width:
            lines.append(cur)
            cur = ""
        cur += part
    if cur:
        lines.append(cur)
    return lines


def saved_message(paths, cwd: str | None = None, width: int = 40) -> str:
    """The `w` key's message: the folder once (cut after a "/", never mid-name), then the file names."""
    from pathlib import Path

    paths = [Path(str(p)) for p in paths]
    folders = {str(p.parent) for p in paths}
    if len(folders) == 1:
        folder = short_path(folders.pop(), cwd) or "."
        head = wrap_path(folder.rstrip("/") + "/", width)
        return "\n".join(["saved in"] + head + ["  " + ", ".join(p.name for p in paths)])
    out = ["saved"]
    for p in paths:
        out += wrap_path(short_path(str(p), cwd), width)
    return "\n".join(out)
