"""``Evidence.ranks[i]``: everything observed in one process."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diag.evidence._schema import median
from diag.evidence.amp import AmpSection
from diag.evidence.dataloaders import DataLoaderInfo
from diag.evidence.distributed import DistributedSection
from diag.evidence.extras import ExtrasSection
from diag.evidence.flops import FlopsSection
from diag.evidence.memory import MemorySection
from diag.evidence.models import ForwardSite, ModelInfo, OptimizerInfo
from diag.evidence.run import ExceptionInfo
from diag.evidence.steps import StepRecord, StepStats
from diag.evidence.sync import SyncSection
from diag.evidence.timeline import TimelineSection

# Bounds that keep Evidence small for long runs: the newest steps are kept in full, older ones
# only in the running aggregates (`StepStats`).
MAX_STEPS_KEPT = 2000
MAX_EXCEPTIONS_KEPT = 20
MAX_LIST_SECTION = 2000

_RANK_SECTIONS = {"memory": MemorySection, "flops": FlopsSection, "amp": AmpSection, "sync": SyncSection,
                  "distributed": DistributedSection, "extras": ExtrasSection, "timeline": TimelineSection}


@dataclass
class RankEvidence:
    rank: int = 0                         # global rank
    local_rank: int = 0                   # rank on its host
    world_size: int = 1                   # processes in the job
    host: str = ""                        # host name
    pid: int | None = None                # process id
    started_at: float | None = None       # unix time the probe started in it
    status: str = "running"             # as RunInfo.status, for this process
    exit_code: int | None = None          # as RunInfo.exit_code
    steps: list[StepRecord] = field(default_factory=list)     # newest MAX_STEPS_KEPT
    step_stats: StepStats = field(default_factory=StepStats)  # sums over every step
    dataloaders: list[DataLoaderInfo] = field(default_factory=list)  # every DataLoader iterated
    models: list[ModelInfo] = field(default_factory=list)  # every module called as a top-level forward
    forwards: list[ForwardSite] = field(default_factory=list)  # top-level forwards grouped by model, call site and mode
    optimizers: list[OptimizerInfo] = field(default_factory=list)  # torch.optim optimizers stepped
    backward_calls: int = 0               # backward passes through a model's output
    exceptions: list[ExceptionInfo] = field(default_factory=list)  # exceptions (at most 20)
    # Sections filled by probe extensions (typed: diag/evidence/<section>.py; docs/evidence.md).
    memory: MemorySection = field(default_factory=MemorySection)  # CUDA allocator stats, breakdown, OOM, estimate
    flops: FlopsSection = field(default_factory=FlopsSection)    # FlopCounterMode over one real step
    amp: AmpSection = field(default_factory=AmpSection)          # GradScaler use
    sync: SyncSection = field(default_factory=SyncSection)       # host-device synchronisations
    distributed: DistributedSection = field(default_factory=DistributedSection)  # backend, DDP, collectives
    extras: ExtrasSection = field(default_factory=ExtrasSection)  # the perf extension's records, probe errors
    timeline: TimelineSection = field(default_factory=TimelineSection)  # CUDA runs: device time per step, GPU idle

    def __setattr__(self, name: str, value: Any) -> None:
        cls = _RANK_SECTIONS.get(name)
        if cls is not None and isinstance(value, dict) and not isinstance(value, cls):
            value = cls(value)   # a plain dict assigned to a section becomes the typed section
        object.__setattr__(self, name, value)

    # ---- convenience for checks -------------------------------------------------------------
    def timed_steps(self, skip_warmup: int = 1) -> list[StepRecord]:
        """Kept steps that are usable for timing: instrumented ones dropped, the first
        ``skip_warmup`` dropped when enough remain."""
        steps = [s for s in self.steps if not s.instrumented]
        if len(steps) > skip_warmup + 2:
            steps = [s for s in steps if s.index > skip_warmup]
        return steps

    def median_step(self, skip_warmup: int = 1) -> dict[str, float] | None:
        """Median of each phase over the timed steps (None without steps)."""
        steps = self.timed_steps(skip_warmup)
        if not steps:
            return None
        out = {}
        for name in ("total_s", "data_s", "forward_s", "backward_s", "optimizer_s", "other_s"):
            out[name] = median([getattr(s, name) for s in steps])
        out["n"] = len(steps)
        return out

    def model(self, model_id: int) -> ModelInfo | None:
        for m in self.models:
            if m.id == model_id:
                return m
        return None
