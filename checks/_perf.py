"""Helpers shared by the performance checklist (amp, dataloader, eval, parallel, tuning, sync).
Pure Python over Evidence: no torch."""
from __future__ import annotations

from diag.checks.api import cuda_device, device_types, fmt_bytes, median, training_models, training_sites

__all__ = ["TUNING_GUIDE", "HALF", "PERF_MISSING", "guide", "perf_ran", "capability", "cap_str", "autocast_dtypes",
           "half_param_dtypes", "phase_medians", "amdahl", "short_file", "size",
           # from the API, for the check modules:
           "cuda_device", "device_types", "training_models", "training_sites"]

TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
HALF = ("float16", "bfloat16")


def guide(anchor: str) -> str:
    return f"{TUNING_GUIDE}#{anchor}"


def perf_ran(r) -> bool:
    """Did the perf probe extension (diag.probe.perf) run in this rank?"""
    return isinstance(r.extras, dict) and "perf" in r.extras


PERF_MISSING = ("the perf probe extension (diag.probe.perf) did not record this run "
                "(disabled with DIAG_PROBE_DISABLE, or evidence from an older diag)")


def capability(dev) -> tuple[int, int] | None:
    if dev is None or not dev.capability:
        return None
    cap = list(dev.capability) + [0, 0]
    return int(cap[0]), int(cap[1])


def cap_str(cap) -> str:
    return f"{cap[0]}.{cap[1]}" if cap else "unknown"


def autocast_dtypes(r) -> set[str]:
    return {s.autocast for s in training_sites(r) if s.autocast}


def half_param_dtypes(models) -> set[str]:
    return {d for m in models for d in (m.dtypes or []) if d in HALF}


def phase_medians(r) -> dict | None:
    """Medians over the timed steps: total, data, forward, backward, optimizer, other, and the
    compute share (forward + backward over total)."""
    m = r.median_step()
    if not m or m["total_s"] <= 0:
        return None
    steps = r.timed_steps()
    compute = median([s.forward_s + s.backward_s for s in steps])
    m["compute_s"] = compute
    m["compute_share"] = compute / m["total_s"]
    return m


def amdahl(share: float, speedup: float) -> float:
    """Whole-step speed-up when a part taking ``share`` of the step gets ``speedup`` times faster."""
    share = min(max(share, 0.0), 1.0)
    return 1.0 / ((1.0 - share) + share / speedup)


def short_file(d: dict | None) -> str:
    if not d:
        return ""
    f = str(d.get("file", "?")).rsplit("/", 1)[-1]
    return f"{f}:{d['line']}" if d.get("line") is not None else f


def size(n: float | None) -> str:
    """Bytes for people: 512 B, 12.0 KiB, 3.4 MiB, 1.25 GiB."""
    return fmt_bytes(n, style="precise")
