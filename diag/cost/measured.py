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


def peak_for(device_name: str | None, precision: str = "fp32") -> tuple[str | None, float | None, str | None]:
    """Look a GPU up by name in diag's catalogue: ``(catalogue id, dense peak FLOP/s per device for
    the precision, note)``; the peak is None (and the note says why) when the catalogue has no figure."""
    if not device_name:
        return None, None, "the device name was not recorded"
    from diag.cost.catalog import load_catalog
    from diag.errors import DiagError

    note = None
    try:
        cat = load_catalog()
    except DiagError as e:
        cat = load_catalog(user=False)
        note = f"your GPU catalogue was not used ({e.message})"
    gpu = cat.match_device(device_name)
    if gpu is None:
        return None, None, (f"{device_name!r} is not in the GPU catalogue: add it to "
                            "~/.config/diag/gpus.toml for MFU")
    peak = gpu.peak_flops(precision, per="device")
    if peak is None:
        return gpu.id, None, f"{gpu.name} has no dense {precision} rate in the catalogue"
    return gpu.id, peak, note


def judge_rank(rank) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The recorded FLOP measurement of one RankEvidence judged against the catalogue, in diag's
    process: ``(measured, summary)``. ``measured`` is ``flops.measured`` with ``gpu``, ``peak_flops`` and
    ``peak_note`` looked up now from the recorded device name and precision (evidence from older probes
    that stored a peak keeps it when the catalogue has none); ``summary`` is :func:`summarize` over the
    rank's timed steps (step_s, mfu, hfu, ...). None when no FLOPs were measured. The one computation
    behind the cost.mfu check (diag.checks.api.flops_summary), ``diag cost`` and ``diag compare``."""
    flops = rank.flops if isinstance(rank.flops, dict) else {}
    measured = flops.get("measured")
    if not isinstance(measured, dict) or not measured.get("flops"):
        return None
    m = dict(measured)
    if m.get("device") == "cpu" or (not m.get("device_name") and m.get("device") in (None, "cpu")):
        m.setdefault("peak_note", "CPU run: the catalogue has no CPU peaks, so MFU is N/A")
    elif m.get("device_name"):
        gpu_id, peak, note = peak_for(m.get("device_name"), m.get("precision") or "fp32")
        if peak is not None or not m.get("peak_flops"):
            m["gpu"], m["peak_flops"], m["peak_note"] = gpu_id or m.get("gpu"), peak, note
    totals = timed_totals((s.index, s.total_s, s.instrumented) for s in rank.steps)
    instrumented = [s.total_s for s in rank.steps if s.instrumented]
    return m, summarize(m, totals, instrumented)


def from_rank(rank) -> dict[str, Any] | None:
    """The judged summary of one RankEvidence (:func:`judge_rank`; None when no FLOPs were measured)."""
    judged = judge_rank(rank)
    return judged[1] if judged else None
