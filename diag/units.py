"""Units for people: the one place diag turns bytes, seconds, shares, FLOPs and hours into text.

Every report (console, TUI, ``diag memory``, ``diag cost``) and every check formats through these
functions; the check API re-exports them (``from diag.checks.api import fmt_bytes, fmt_seconds``).
Pure Python, no third-party imports.

Each formatter takes ``None`` and prints ``na`` ("N/A" unless told otherwise).
"""
from __future__ import annotations

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

__all__ = ["KiB", "MiB", "GiB", "TiB", "fmt_bytes", "fmt_seconds", "fmt_pct", "fmt_flops", "fmt_sci",
           "fmt_hours", "fmt_count"]


def fmt_bytes(n: float | int | None, *, style: str = "plan", signed: bool = False, na: str = "N/A") -> str:
    """Bytes, binary units. Styles (one per kind of report, kept stable for their readers):

    - ``plan`` (default): ``1.50 GiB``, ``312 MiB``, ``12 KiB``, ``512 B``; ``signed`` adds ``+``
    - ``short``: three significant figures up to TiB: ``1.5 GiB``, ``312 MiB``, ``12.0 KiB``
    - ``gib``: ``1.50 GiB`` from 1 GiB up, whole MiB below
    - ``precise``: ``1.25 GiB``, ``3.4 MiB``, ``12.0 KiB``, ``512 B``
    """
    if n is None:
        return na
    if style == "plan":
        sign = ""
        if signed and n > 0:
            sign = "+"
        if n < 0:
            sign, n = "-", -n
        if n >= GiB:
            return f"{sign}{n / GiB:.2f} GiB"
        if n >= MiB:
            return f"{sign}{n / MiB:.0f} MiB"
        if n >= KiB:
            return f"{sign}{n / KiB:.0f} KiB"
        return f"{sign}{int(n)} B"
    n = float(n)
    if style == "short":
        for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
            if abs(n) >= size:
                v = n / size
                return f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
        return f"{n:.0f} B"
    if style == "gib":
        if abs(n) >= GiB:
            return f"{n / GiB:.2f} GiB"
        return f"{n / MiB:.0f} MiB"
    if style == "precise":
        for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
            if abs(n) >= div:
                return f"{n / div:.2f} {unit}" if unit == "GiB" else f"{n / div:.1f} {unit}"
        return f"{int(n)} B"
    raise ValueError(f"unknown bytes style {style!r}")


def fmt_seconds(seconds: float | None, *, fine: bool = False, na: str = "N/A") -> str:
    """A duration: seconds from 1 s up (``2.35 s``), milliseconds below (``12.5 ms``).
    ``fine`` adapts the digits to the size (``12.3 s``, ``2.35 s``, ``123 ms``, ``12.5 ms``, ``0.42 ms``)."""
    if seconds is None:
        return na
    if not fine:
        if seconds >= 1:
            return f"{seconds:.2f} s"
        return f"{1000 * seconds:.1f} ms"
    if seconds >= 10:
        return f"{seconds:.1f} s"
    if seconds >= 1:
        return f"{seconds:.2f} s"
    v = seconds * 1000
    if v >= 100:
        return f"{v:.0f} ms"
    if v >= 1:
        return f"{v:.1f} ms"
    return f"{v:.2f} ms"


def fmt_pct(share: float | None, *, digits: int | None = None, style: str = "auto", na: str = "N/A") -> str:
    """A share (0..1) as a percentage.

    - ``digits`` given: exactly that many decimals (``fmt_pct(0.123, digits=1)`` = ``12.3%``)
    - style ``auto`` (default): whole percent from 1% up, one decimal below (``42%``, ``0.5%``)
    - style ``cost``: one decimal below 10%, whole percent above (``4.2%``, ``42%``)
    """
    if share is None:
        return na
    if digits is not None:
        return f"{100 * share:.{digits}f}%"
    if style == "cost":
        return f"{100 * share:.1f}%" if share < 0.1 else f"{100 * share:.0f}%"
    return f"{100 * share:.0f}%" if share >= 0.01 else f"{100 * share:.1f}%"


def fmt_sci(x: float | int | None, na: str = "N/A") -> str:
    """A large number in scientific notation with 3 significant figures: ``1.23e18``."""
    if not isinstance(x, (int, float)) or isinstance(x, bool):
        return na
    return f"{x:.3g}".replace("e+", "e")


def fmt_flops(x: float | None, *, per_second: bool = False, na: str = "N/A") -> str:
    """FLOPs (``1.23e18 FLOPs``) or, with ``per_second``, throughput in TFLOPS (``312.0 TFLOPS``)."""
    if x is None:
        return na
    if per_second:
        return f"{x / 1e12:,.1f} TFLOPS"
    return f"{fmt_sci(x, na)} FLOPs"


def fmt_hours(h: float | None, *, style: str = "plain", na: str = "N/A") -> str:
    """A number of hours, without the unit.

    - ``plain`` (default): ``1,234``, ``12.50``, ``0.123``
    - ``compact``: ``<0.001``, ``12.3``, ``1,234``, ``45k``, ``1.20M`` (for narrow columns)
    """
    if h is None:
        return na
    if style == "compact":
        if 0 < h < 0.001:
            return "<0.001"
        if h >= 1e6:
            return f"{h / 1e6:.2f}M"
        if h >= 1e4:
            return f"{h / 1e3:,.0f}k"
        if h >= 100:
            return f"{h:,.0f}"
        return f"{h:.3g}"
    return f"{h:,.0f}" if h >= 100 else f"{h:,.2f}" if h >= 1 else f"{h:.3g}"


def fmt_count(x: float | None, na: str = "N/A") -> str:
    """A count with a short suffix: ``1.2M``, ``340k``, ``12``."""
    if x is None:
        return na
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.3g}"


def fmt_wall_hours(hours: float) -> str:
    """A wall-clock duration given in hours, in the unit a person reads it in: days above 48 h,
    hours above 1 h, minutes above 1 min, else seconds (cost estimates)."""
    if hours >= 48:
        return f"{hours / 24:,.1f} days"
    if hours >= 1:
        return f"{hours:,.1f} hours"
    if hours >= 1 / 60:
        return f"{hours * 60:,.1f} minutes"
    return f"{hours * 3600:.3g} seconds"
