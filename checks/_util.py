"""Small helpers shared by the built-in checks (pure Python, over the public API only)."""
from __future__ import annotations

from diag.checks.api import fmt_bytes, fmt_pct, fmt_seconds, location

TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"

pct = fmt_pct          # 42%, 0.5%
ms = fmt_seconds       # 2.35 s, 12.5 ms
loc = location


def gib(n: float | None) -> str:
    """1.50 GiB from 1 GiB up, whole MiB below."""
    return fmt_bytes(n, style="gib")
