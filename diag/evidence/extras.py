"""``RankEvidence.extras``: what the perf probe extension and the fold record beside the core sections
(shapes: docs/performance-checks.md)."""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class ExtrasSection(Section):
    """Per-topic records of the perf probe extension, and the fold's own notes."""
    perf: dict[str, Any] | None = None  # machine facts for amp.availability; present when the perf extension ran
    eval_graph: Any = None              # eval-mode forwards that built an autograd graph: bytes kept alive
    input_shapes: Any = None            # per convolutional model: distinct training input shapes
    data_parallel: Any = None           # per nn.DataParallel model: its device_ids
    optimizers: Any = None              # per optimizer: parameter device, foreach/fused given and resolved
    module_zero_grad: Any = None        # nn.Module.zero_grad() calls (set_to_none=False ones, time, where)
    debug: Any = None                   # steps run with anomaly detection / a profiler on
    compile: Any = None                 # torch.compile calls and compiled models
    copies: Any = None                  # host-to-device copies in the sync window: bytes, pageable non_blocking
    end_reason: str | None = None       # the probe's reason at the end of the run
    probe_errors: list[dict[str, Any]] | None = None  # probe hooks that failed (where, error, traceback)
    events: dict[str, Any] | None = None  # events of unknown kinds, by kind (at most 100 each)
    attach: dict[str, Any] | None = None  # diag attach: what sampling saw (phases, stacks, workers; docs/attach.md)
