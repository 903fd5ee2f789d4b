"""``RankEvidence.flops``: FLOPs of one real training step (probe extension diag.probe.flops).

The probe records the FLOPs and the device name; diag judges them: MFU is computed in diag's process
against the GPU catalogue (``diag.checks.api.flops_summary``), so a corrected catalogue re-judges saved
evidence. ``peak_flops``/``gpu``/``peak_note`` in ``measured`` are written only by older probes
(schema 1) and read as a fallback."""
from __future__ import annotations

from typing import Any, Iterable

from diag.evidence._schema import Section


class FlopsMeasured(Section):
    """The counted step (``flops.measured``)."""
    step: int | None = None             # the training step that was counted
    flops: float | None = None          # executed FLOPs of the step (recomputed forwards included) [FLOPs]
    model_flops: float | None = None    # model FLOPs (3 x forward when recomputation was detected) [FLOPs]
    forward_flops: float | None = None  # [FLOPs]
    backward_flops: float | None = None  # [FLOPs]
    window_flops: float | None = None   # FLOPs counted over the whole window [FLOPs]
    recompute_detected: bool | None = None  # backward > 2.5 x forward: activation checkpointing
    samples: int | None = None          # samples in the counted step
    tokens: int | None = None           # tokens in the counted step (integer inputs)
    n_forward: int | None = None        # training forwards in the counted step
    params: int | None = None           # parameters of the trained models
    params_non_embedding: int | None = None
    analytic_flops: float | None = None  # 6 x N x D for the step [FLOPs]
    analytic_basis: str | None = None   # "tokens" | "samples"
    ratio_to_analytic: float | None = None  # model_flops / analytic_flops
    precision: str | None = None        # fp32 | tf32 | bf16 | fp16: the peak MFU is judged against
    precision_reason: str | None = None  # why that precision (autocast dtype, parameter dtype)
    device: str | None = None           # device type: cuda | cpu | mps
    device_name: str | None = None      # the device's name as torch reports it (catalogue key)
    gpu: str | None = None              # catalogue id (schema 1 only)
    peak_flops: float | None = None     # dense peak per device (schema 1 only) [FLOP/s]
    peak_note: str | None = None        # why there is no peak (schema 1 only)
    world_size: int | None = None
    compiled: bool | None = None        # a torch.compile'd model was trained
    by_op: dict[str, Any] | None = None  # FLOPs by aten operator [FLOPs]
    by_module: dict[str, Any] | None = None  # FLOPs by module (top 12) [FLOPs]
    instrumented_steps: list[int] | None = None  # steps slowed by counting (left out of timing)
    method: str | None = None           # counted | analytic


class FlopsSection(Section):
    """FLOP counting (``RankEvidence.flops``)."""
    status: str | None = None           # one sentence: what happened to the measurement
    measured: FlopsMeasured | None = None  # the counted step
    achieved: dict[str, Any] | None = None  # achieved FLOP/s over the timed steps, as the probe summarised
                                        # them (MFU in it is schema 1 only: diag re-judges)
    eval: dict[str, Any] | None = None  # evaluation-only runs: FLOPs of one evaluation forward ({flops, samples, tokens,
                                        # params, eval_step, device, device_name, precision, analytic_flops: 2 x N x D})


# ---- achieved throughput (pure arithmetic; used by the probe and by diag.cost.measured) ----------------

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
