"""Pure helpers over the recorded ``Evidence.gpu`` section (plain dicts; no NVML, no I/O), for checks
and for other topics (the memory checks read per-device peak memory here when the allocator's own
statistics are missing).
"""
from __future__ import annotations

from typing import Any, Iterable


def gpu_section(ev) -> dict:
    return getattr(ev, "gpu", None) or {}


def has_devices(gpu: dict) -> bool:
    return bool(gpu.get("devices"))


def no_gpu_reason(gpu: dict) -> str:
    """Why a check cannot look at GPUs (for a `skipped` finding)."""
    if not gpu:
        return "No GPU telemetry was recorded for this run (evidence from a run without the GPU sampler)."
    if gpu.get("reason"):
        r = str(gpu["reason"]).rstrip(".")
        return f"No GPU to look at: {r}."
    if not gpu.get("devices"):
        return "No GPU to look at: the telemetry provider reported zero devices."
    return "No GPU samples were recorded during the run."


def run_devices(gpu: dict) -> tuple[list[dict], str]:
    """The devices the run used, and how that was decided:

    - ``"processes"``: the run's own processes were seen on them (the reliable way);
    - ``"activity"``: process information was missing, so the visible devices that showed activity
      (mean utilisation >= 5% or memory growing by >= 256 MiB);
    - ``"visible"``: nothing better: every visible device that was not lost from the start.
    """
    devs = [d for d in gpu.get("devices") or [] if d.get("visible", True)]
    used = [d for d in devs if d.get("used_by_run") is True]
    if used:
        return used, "processes"
    if devs and all(d.get("used_by_run") is False for d in devs):
        return [], "processes"
    active = [d for d in devs if _active(d)]
    if active:
        return active, "activity"
    return [d for d in devs if (d.get("stats") or {}).get("samples", 0) > (d.get("stats") or {}).get("lost_samples", 0)], \
        "visible"


def _active(d: dict) -> bool:
    st = d.get("stats") or {}
    u = st.get("util_mean")
    if u is not None and u >= 5:
        return True
    hi, lo = st.get("mem_used_max"), st.get("mem_used_min")
    return hi is not None and lo is not None and hi - lo >= 256 * (1 << 20)


def training_window(ev, gpu: dict) -> tuple[float, float] | None:
    """(start, end) of the timed training steps, in seconds since ``gpu["t0"]``; None without steps
    or without a time base."""
    t0 = gpu.get("t0")
    if t0 is None:
        return None
    starts, ends = [], []
    for r in getattr(ev, "ranks", []) or []:
        if r.started_at is None:
            continue
        steps = r.timed_steps()
        if not steps:
            continue
        first, last = steps[0], steps[-1]
        starts.append(r.started_at + first.t - first.total_s - t0)
        ends.append(r.started_at + last.t - t0)
    if not starts:
        return None
    return min(starts), max(ends)


# NVML's utilisation is "the percent of time over the past sample period during which one or more
# kernels was executing", a period "between 1 second and 1/6 second depending on the product": a
# sample taken at t speaks for (t - period, t]. The longer period is assumed, so that no sample counted
# for the steady steps reaches back into start-up, FLOP counting or an evaluation pass.
NVML_PERIOD_S = 1.0
STEP_GAP_S = 0.005      # steps closer than this are one stretch (the step model's steps are contiguous)


def steady_windows(ev, gpu: dict) -> list[tuple[float, float]]:
    """The stretches of steady training steps on the sampler's clock (seconds since ``gpu["t0"]``):
    the timed steps of every rank (the first step, steps slowed by FLOP counting and steps not kept
    left out), adjacent steps merged; evaluation passes, start-up and shutdown fall between or
    outside them. Empty without steps or without a time base."""
    t0 = gpu.get("t0")
    if t0 is None:
        return []
    spans = []
    for r in getattr(ev, "ranks", []) or []:
        if r.started_at is None:
            continue
        for s in r.timed_steps():
            if s.total_s <= 0:
                continue
            end = r.started_at + s.t - t0
            spans.append((end - s.total_s, end))
    spans.sort()
    out: list[list[float]] = []
    for a, b in spans:
        if out and a <= out[-1][1] + STEP_GAP_S:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def steady_values(device: dict, column: str, windows: list[tuple[float, float]],
                  period: float = NVML_PERIOD_S) -> tuple[list[float], int]:
    """``(values, raw samples)`` of ``column`` whose whole span lies inside one steady stretch: a
    point at t speaks for (t - period, t], widened by half the spacing of its neighbours when it
    merges several raw samples (``stride`` > 1). NA dropped."""
    s = device.get("series") or {}
    ts = s.get("t") or []
    vs = s.get(column) or []
    stride = int(device.get("stride") or 1)
    out, raw = [], 0
    for i, (t, v) in enumerate(zip(ts, vs)):
        if v is None or t is None:
            continue
        half = 0.0
        if stride > 1:
            nb = [abs(ts[j] - t) for j in (i - 1, i + 1) if 0 <= j < len(ts) and ts[j] is not None]
            half = (min(nb) / 2) if nb else 0.0
        lo, hi = t - half - period, t + half
        if any(a <= lo and hi <= b for a, b in windows):
            out.append(v)
            raw += stride
    return out, raw


def window_values(device: dict, column: str, window: tuple[float, float] | None,
                  pad: float = 0.0) -> list[float]:
    """The recorded values of ``column`` inside the window (all when window is None), NA dropped.
    ``pad`` widens the window's end (a utilisation sample averages the period before it)."""
    s = device.get("series") or {}
    ts = s.get("t") or []
    vs = s.get(column) or []
    out = []
    for t, v in zip(ts, vs):
        if v is None:
            continue
        if window is not None and (t is None or t < window[0] or t > window[1] + pad):
            continue
        out.append(v)
    return out


def mean(values: Iterable[float]) -> float | None:
    v = list(values)
    return sum(v) / len(v) if v else None


def percentile(values: Iterable[float], q: float) -> float | None:
    v = sorted(values)
    if not v:
        return None
    k = (len(v) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def peak_memory_by_device(ev) -> dict[int, dict[str, Any]]:
    """Per device: peak memory used (whole device, and by the run's own processes when known) and
    the total, from the recorded telemetry. ``{index: {"used_max", "run_max", "total", "name"}}``."""
    gpu = gpu_section(ev)
    out = {}
    for d in gpu.get("devices") or []:
        st = d.get("stats") or {}
        out[d.get("index", 0)] = {"used_max": st.get("mem_used_max"), "run_max": st.get("run_mem_max"),
                                  "total": d.get("memory_total"), "name": d.get("name"),
                                  "used_by_run": d.get("used_by_run"), "simulated": bool(gpu.get("simulated"))}
    return out


def label(gpu: dict) -> str:
    """"" or " (simulated)" — every finding built on simulated values says so."""
    return " (simulated GPUs)" if gpu.get("simulated") else ""


def dev_name(d: dict) -> str:
    return f"GPU {d.get('index', '?')}"
