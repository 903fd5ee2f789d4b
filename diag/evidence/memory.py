"""``RankEvidence.memory``: the CUDA caching allocator as the probe extension diag.probe.memory saw it
(per step, the breakdown of the peak, the OOM, the fake-tensor estimate). Shapes of the nested
records: docs/memory.md."""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class MemoryDevice(Section):
    """The CUDA device the rank's memory was measured on."""
    type: str | None = None             # "cuda"
    index: int | None = None            # CUDA device index
    name: str | None = None             # torch.cuda.get_device_properties().name
    total: int | None = None            # device memory [bytes]
    capability: list[int] | None = None  # compute capability (major, minor)


class MemorySection(Section):
    """CUDA allocator statistics, breakdown, OOM and estimate (``RankEvidence.memory``)."""
    device: MemoryDevice | None = None  # the device measured (CUDA only)
    steps: list[dict[str, Any]] | None = None  # one record per training step: allocated/reserved/peak
                                        # [bytes], retries, phases (newest 2,000)
    persistent: dict[str, Any] | None = None  # parameters, gradients, optimizer state [bytes]
    breakdown: dict[str, Any] | None = None   # the peak by category, made at the step whose peak rose
    oom: dict[str, Any] | None = None   # the out-of-memory error: parsed message numbers [bytes], step
    capture: dict[str, Any] | None = None  # model inputs captured for the replay
    estimate: dict[str, Any] | None = None  # fake-tensor replay: peak per batch, largest batch that fits
