"""Byte sizes: parse ``24GiB`` / ``80GB`` / ``512MiB`` and format them. Pure Python."""
from __future__ import annotations

import re

from diag import units as _units
from diag.errors import DiagError

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10 ** 3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10 ** 6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10 ** 9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10 ** 12,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*$")

GiB = 1 << 30
MiB = 1 << 20


def parse_size(text: str) -> int:
    """``24GiB`` -> bytes. GiB/MiB are binary, GB/MB decimal (as vendors print them); a bare
    ``G`` means GiB. Raises DiagError with one sentence on anything else."""
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise DiagError(f"cannot read {text!r} as a memory size; write it like 24GiB, 80GB or 512MiB")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value <= 0:
        raise DiagError(f"the memory size must be positive, not {text!r}")
    return int(value)


def fmt_bytes(n: float | int | None, signed: bool = False) -> str:
    """1.50 GiB / 312 MiB / 12 KiB / N/A (see :func:`diag.units.fmt_bytes`)."""
    return _units.fmt_bytes(n, signed=signed)
