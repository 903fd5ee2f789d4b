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

from typing import Any


# The arithmetic lives beside the section it fills (the probe uses it too, and must not import diag.cost).
from diag.evidence.flops import median, summarize, timed_totals  # re-exported


def from_rank(rank) -> dict[str, Any] | None:
    """``summarize`` for one RankEvidence (None when no FLOPs were measured on it)."""
    measured = (rank.flops or {}).get("measured") if isinstance(rank.flops, dict) else None
    if not measured or not measured.get("flops"):
        return None
    totals = timed_totals((s.index, s.total_s, s.instrumented) for s in rank.steps)
    instrumented = [s.total_s for s in rank.steps if s.instrumented]
    return summarize(measured, totals, instrumented)
