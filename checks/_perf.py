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


# ---- what a predicted speed-up rests on (issue 31) ---------------------------------------------------
# A precision change speeds up the matmuls (the ops FlopCounterMode counts: mm, addmm, bmm,
# convolution, attention) by at most the catalogue's peak ratio for the device. The share of the step
# they take is bounded below by the counted FLOPs at the fp32 peak (a matmul cannot run faster than
# the peak) and above by forward+backward. Below LAUNCH_BOUND_SHARE the step's time is mostly not matmul
# work (kernel launches, memory-bound ops, the host): the gain cannot be predicted, only measured.
LAUNCH_BOUND_SHARE = 0.15
GUIDE_AMP_SPEEDUP = 3.0     # the tuning guide's "up to 3x": used only when the catalogue has no peak


def precision_gain(ev, r, dev, to: str, label: str) -> dict:
    """The range of whole-step speed-ups from running fp32 matmuls in ``to`` (bf16, fp16, tf32) on
    ``dev``, with its basis: ``{low, high, share_low, share_high, clock, peak_ratio, ratio_basis,
    predictable, launch_bound, step_s}`` (None where unknown). ``label``: "bf16", "TF32" for the text."""
    from diag.checks.api import device_phases, flops_summary, peak_flops

    name = dev.name if dev is not None else None
    gpu, p32, _ = peak_flops(name, "fp32")
    _, pto, _ = peak_flops(name, to)
    if p32 and pto:
        ratio, ratio_basis = pto / p32, f"the catalogue's {label}/fp32 dense peak ratio on {gpu}"
    else:
        ratio, ratio_basis = GUIDE_AMP_SPEEDUP, "the tuning guide's \"up to 3x\" (the catalogue has no peaks for this GPU)"
    dph = device_phases(r)
    if dph and dph["total_s"] > 0:
        share, clock, step_s = (dph["forward_s"] + dph["backward_s"]) / dph["total_s"], "device", dph["total_s"]
    else:
        ph = phase_medians(r)
        share, clock, step_s = (ph["compute_share"], "host", ph["total_s"]) if ph else (None, None, None)
    share_low = None
    judged = flops_summary(r)
    if judged and p32:
        measured, summary = judged
        flops, st = measured.get("flops"), summary.get("step_s") or step_s
        if flops and st:
            share_low = flops / p32 / st
            if share is not None:
                share_low = min(share_low, share)
    high = amdahl(share, ratio) if share is not None else None
    low = amdahl(share_low, ratio) if share_low is not None else None
    launch = share_low is not None and share_low < LAUNCH_BOUND_SHARE
    return {"low": round(low, 2) if low else None, "high": round(high, 2) if high else None,
            "share_low": round(share_low, 4) if share_low is not None else None,
            "share_high": round(share, 4) if share is not None else None, "clock": clock,
            "step_s": round(step_s, 6) if step_s else None, "peak_ratio": round(ratio, 2),
            "ratio_basis": ratio_basis, "launch_bound": launch, "predictable": not launch and high is not None,
            "label": label}


def gain_sentence(g: dict) -> str:
    """The prediction in words, with its basis; '' without a share to judge."""
    if g["high"] is None:
        return ""
    step = f"{g['step_s'] * 1000:.1f} ms " if g.get("step_s") else ""
    if g["launch_bound"]:
        return (f"; the matmul FLOPs counted in one step would take only {g['share_low']:.0%} of the {step}step even "
                f"at the fp32 peak, so most of it is not matmul work (kernel launches, memory-bound ops, the "
                f"host): diag cannot predict what {g['label']} gains here; measure it (the same run with and "
                "without it, compared with `diag compare`)")
    ratio = f"{g['peak_ratio']:.1f}x ({g['ratio_basis']})"
    if g["low"] is not None:
        return (f"; the step could get {g['low']:.1f}x to {g['high']:.1f}x faster: the low end speeds up only the "
                f"time the counted matmul FLOPs need at the fp32 peak ({g['share_low']:.0%} of the {step}step), "
                f"the high end all of forward+backward ({g['share_high']:.0%}, {g['clock']} clock), each by "
                f"{ratio}")
    return (f"; the step could get at most {g['high']:.1f}x faster, an upper bound: forward+backward take "
            f"{g['share_high']:.0%} of the {step}step ({g['clock']} clock), all of it sped up by {ratio}; FLOPs were "
            "not counted, so the matmul share and a low end are unknown: measure it")
