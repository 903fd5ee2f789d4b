"""Achieved FLOP/s, MFU and HFU from one measured step and the run's step times. Pure Python.

The probe extension :mod:`diag.probe.flops` counts the FLOPs of one real training step with
``torch.utils.flop_counter.FlopCounterMode`` and writes ``flops.measured`` (see docs/cost.md); this
module turns that record plus the median time of the *other* steps into throughput:

* achieved model FLOP/s = model FLOPs of the step / median step time
* MFU = achieved model FLOP/s / dense peak of the device for the precision the run used
  (PaLM's definition, Chowdhery et al. 2022, section 4.1)
* HFU = executed FLOPs (recomputed forwards included) / median step time / peak

The instrumented step itself is excluded from the median (it runs slower under the counter); its
extra time is reported as the counter's overhead.
"""
from __future__ import annotations

from typing import Any, Iterable


def median(values: Iterable[float]) -> float | None:
    v = sorted(values)
    n = len(v)
    if n == 0:
        return None
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def timed_totals(steps: Iterable[tuple[int, float, bool]]) -> list[float]:
    """Step times usable for timing: (index, total_s, instrumented) -> totals, instrumented steps
    dropped and the first step dropped when more than 3 remain (the same rule as
    ``RankEvidence.timed_steps``)."""
    rows = [(i, t) for i, t, ins in steps if not ins and t and t > 0]
    if len(rows) > 3:
        rows = [(i, t) for i, t in rows if i > 1]
    return [t for _, t in rows]


def summarize(measured: dict[str, Any], step_totals: list[float],
              instrumented_totals: list[float] | None = None) -> dict[str, Any]:
    """Throughput from a ``flops.measured`` record and timed step totals (seconds).

    Returns a dict (the shape of ``flops.achieved``): step_s (median), steps_timed,
    model_flops_per_s, hardware_flops_per_s, mfu, hfu (None without a catalogue peak),
    samples_per_s, tokens_per_s, overhead_s / overhead_ratio of the instrumented step.
    """
    out: dict[str, Any] = {"step_s": None, "steps_timed": len(step_totals), "model_flops_per_s": None,
                           "hardware_flops_per_s": None, "mfu": None, "hfu": None, "samples_per_s": None,
                           "tokens_per_s": None, "overhead_s": None, "overhead_ratio": None,
                           "peak_flops": measured.get("peak_flops")}
    med = median(step_totals)
    if not med or med <= 0:
        out["reason"] = "no timed step besides the instrumented one"
        return out
    out["step_s"] = med
    model = measured.get("model_flops") or 0
    hw = measured.get("flops") or 0
    out["model_flops_per_s"] = model / med if model else None
    out["hardware_flops_per_s"] = hw / med if hw else None
    peak = measured.get("peak_flops")
    if peak and model:
        out["mfu"] = model / med / peak
    if peak and hw:
        out["hfu"] = hw / med / peak
    if measured.get("samples"):
        out["samples_per_s"] = measured["samples"] / med
    if measured.get("tokens"):
        out["tokens_per_s"] = measured["tokens"] / med
    if instrumented_totals:
        extra = [t - med for t in instrumented_totals]
        out["overhead_s"] = sum(extra)
        out["overhead_ratio"] = max(extra) / med
    return out


def from_rank(rank) -> dict[str, Any] | None:
    """``summarize`` for one RankEvidence (None when no FLOPs were measured on it)."""
    measured = (rank.flops or {}).get("measured") if isinstance(rank.flops, dict) else None
    if not measured or not measured.get("flops"):
        return None
    totals = timed_totals((s.index, s.total_s, s.instrumented) for s in rank.steps)
    instrumented = [s.total_s for s in rank.steps if s.instrumented]
    return summarize(measured, totals, instrumented)
