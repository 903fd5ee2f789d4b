"""Parse out-of-memory messages (CUDA caching allocator, CPU allocator) into numbers. Pure Python."""
from __future__ import annotations

import re

_UNITS = {"b": 1, "bytes": 1, "kib": 1 << 10, "kb": 1 << 10, "mib": 1 << 20, "mb": 1 << 20,
          "gib": 1 << 30, "gb": 1 << 30, "tib": 1 << 40, "tb": 1 << 40}


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _UNITS[unit.lower()])


_SIZE = r"([0-9]+(?:\.[0-9]+)?)\s*(B|bytes|KiB|KB|MiB|MB|GiB|GB|TiB|TB)"

_PATTERNS = {
    "requested": re.compile(r"[Tt]ried to allocate " + _SIZE),
    "capacity": re.compile(r"total capacity of " + _SIZE),
    "free": re.compile(r"of which " + _SIZE + r" is free"),
    "process_in_use": re.compile(r"this process has " + _SIZE + r" memory in use"),
    "allocated": re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch"),
    "reserved_unallocated": re.compile(_SIZE + r" is reserved by PyTorch but unallocated"),
    # older formats
    "allocated_old": re.compile(_SIZE + r" already allocated"),
    "reserved_old": re.compile(_SIZE + r" reserved in total by PyTorch"),
    "cpu_requested": re.compile(r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory): you tried to allocate (\d+) bytes"),
}
_GPU = re.compile(r"GPU (\d+) has a total capacity")


def parse_oom(message: str) -> dict:
    """Numbers (bytes) found in an OOM message; keys absent when the message does not say."""
    out: dict = {}
    for key, pat in _PATTERNS.items():
        m = pat.search(message or "")
        if not m:
            continue
        if key == "cpu_requested":
            out["requested"] = int(m.group(1))
            out["device"] = "cpu"
            continue
        val = _bytes(m.group(1), m.group(2))
        if key == "allocated_old":
            out.setdefault("allocated", val)
        elif key == "reserved_old":
            out.setdefault("reserved", val)
        else:
            out[key] = val
    g = _GPU.search(message or "")
    if g:
        out["device"] = f"cuda:{g.group(1)}"
    elif "CUDA out of memory" in (message or "") or "CUDA error: out of memory" in (message or ""):
        out.setdefault("device", "cuda")
    if "allocated" in out and "reserved_unallocated" in out:
        out["reserved"] = out["allocated"] + out["reserved_unallocated"]
    return out
