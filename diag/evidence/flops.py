"""``RankEvidence.flops``: FLOPs of one real training step (probe extension diag.probe.flops).

The probe records the FLOPs and the device name; diag judges them: MFU is computed in diag's process
against the GPU catalogue (``diag.checks.api.flops_summary``), so a corrected catalogue re-judges saved
evidence. ``peak_flops``/``gpu``/``peak_note`` in ``measured`` are written only by older probes
(schema 1) and read as a fallback."""
from __future__ import annotations

from typing import Any

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
