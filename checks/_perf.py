"""Helpers shared by the performance checklist (amp, dataloader, eval, parallel, tuning, sync).
Pure Python over Evidence: no torch."""
from __future__ import annotations

from diag.evidence import median

TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"
HALF = ("float16", "bfloat16")


def guide(anchor: str) -> str:
    return f"{TUNING_GUIDE}#{anchor}"


def perf_ran(r) -> bool:
    """Did the perf probe extension (diag.probe.perf) run in this rank?"""
    return isinstance(r.extras, dict) and "perf" in r.extras


PERF_MISSING = ("the perf probe extension (diag.probe.perf) did not record this run "
                "(disabled with DIAG_PROBE_DISABLE, or evidence from an older diag)")


def training_sites(r) -> list:
    return [s for s in r.forwards if s.in_step]


def training_models(r) -> list:
    ids = {s.model for s in training_sites(r)}
    return [m for m in r.models if m.id in ids]


def device_types(models) -> set[str]:
    return {str(d).split(":")[0] for m in models for d in (m.devices or [])}


def cuda_index(models) -> int | None:
    for m in models:
        for d in m.devices or []:
            d = str(d)
            if d.startswith("cuda"):
                _, _, idx = d.partition(":")
                return int(idx) if idx.isdigit() else 0
    return None


def cuda_device(ev, models):
    """(DeviceInfo of the CUDA device the training models use, or None)."""
    idx = cuda_index(models)
    if idx is None:
        return None
    for d in ev.environment.devices:
        if d.index == idx and d.type == "cuda":
            return d
    cuda = [d for d in ev.environment.devices if d.type == "cuda"]
    return cuda[0] if cuda else None


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


def loc_str(d: dict | None) -> str:
    if not d:
        return ""
    s = str(d.get("file", "?"))
    if d.get("line") is not None:
        s += f":{d['line']}"
    return s


def short_file(d: dict | None) -> str:
    if not d:
        return ""
    f = str(d.get("file", "?")).rsplit("/", 1)[-1]
    return f"{f}:{d['line']}" if d.get("line") is not None else f


def indent_code(code: str | None, fallback: str) -> str:
    return (code or fallback).strip()


def size(n: float | None) -> str:
    """Bytes for people: 512 B, 12.0 KiB, 3.4 MiB, 1.25 GiB."""
    if n is None:
        return "N/A"
    n = float(n)
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.2f} {unit}" if unit == "GiB" else f"{n / div:.1f} {unit}"
    return f"{int(n)} B"


def cuda_training(r, cid: str, title: str, why_cuda: str):
    """The models this rank trains when it trains on CUDA: ``(models, None)``; otherwise
    ``(None, a skipped Finding)`` saying why the check cannot judge (no training forward, or the
    model trains elsewhere: ``why_cuda`` says why the check is about CUDA)."""
    from ._util import skipped

    if not training_sites(r):
        return None, skipped(cid, title, "No training forward was observed.")
    models = training_models(r)
    if "cuda" not in device_types(models):
        devs = sorted(device_types(models)) or ["cpu"]
        return None, skipped(cid, title, f"The model trains on {', '.join(devs)}: {why_cuda}", devices=devs)
    return models, None
