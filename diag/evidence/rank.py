"""``Evidence.ranks[i]``: everything observed in one process."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diag.evidence._schema import median
from diag.evidence.amp import AmpSection
from diag.evidence.dataloaders import DataLoaderInfo
from diag.evidence.distributed import DistributedSection
from diag.evidence.evaluation import ChildProcess, EvaluationPass, FrameworkInfo
from diag.evidence.extras import ExtrasSection
from diag.evidence.flops import FlopsSection
from diag.evidence.memory import MemorySection
from diag.evidence.models import ForwardSite, ModelInfo, OptimizerInfo
from diag.evidence.probe import ProbeSection
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
                  "distributed": DistributedSection, "extras": ExtrasSection, "probe": ProbeSection,
                  "timeline": TimelineSection}


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
    evaluations: list[EvaluationPass] = field(default_factory=list)  # evaluation passes between training steps
    framework: FrameworkInfo | None = None  # the training framework that drives the loop, when one does
    children: list[ChildProcess] = field(default_factory=list)  # child processes that trained (Hogwild)
    # Sections filled by probe extensions (typed: diag/evidence/<section>.py; docs/evidence.md).
    memory: MemorySection = field(default_factory=MemorySection)  # CUDA allocator stats, breakdown, OOM, estimate
    flops: FlopsSection = field(default_factory=FlopsSection)    # FlopCounterMode over one real step
    amp: AmpSection = field(default_factory=AmpSection)          # GradScaler use
    sync: SyncSection = field(default_factory=SyncSection)       # host-device synchronisations
    distributed: DistributedSection = field(default_factory=DistributedSection)  # backend, DDP, collectives
    extras: ExtrasSection = field(default_factory=ExtrasSection)  # the perf extension's records, probe errors
    probe: ProbeSection = field(default_factory=ProbeSection)    # diag's probe's own cost over the run
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

    def training_loaders(self) -> list[DataLoaderInfo]:
        """The DataLoaders whose batches fed training steps (by what they fed, not by size); without
        roles (older evidence), every loader that delivered batches."""
        train = [d for d in self.dataloaders if d.role == "train" and d.batches > 0]
        if train or any(d.role for d in self.dataloaders):
            return train
        return [d for d in self.dataloaders if d.batches > 0]

    def training_loader(self) -> DataLoaderInfo | None:
        """The training DataLoader that waited longest (None without one)."""
        loaders = self.training_loaders()
        return max(loaders, key=lambda d: (d.wait_s, d.batches)) if loaders else None

    def data_wait_share(self) -> dict[str, float] | None:
        """The one data-wait share every check and view reads: the median over the steady training
        steps of each step's data wait / step time (the first step out when enough remain; with
        DataLoader workers, the steps that waited for an epoch's first batch too: worker start-up is
        dataloader.persistent-workers' to judge). Returns {share, data_s, compute_s, total_s, n}
        (the medians of the same steps) or None without timed steps."""
        steps = self.timed_steps()
        loader = self.training_loader()
        if loader is not None and loader.num_workers > 0:
            starts, prev = set(), None
            for s in self.steps:
                if s.epoch is not None and prev is not None and s.epoch != prev:
                    starts.add(s.index)
                prev = s.epoch
            kept = [s for s in steps if s.index not in starts]
            if len(kept) >= 2:
                steps = kept
        steps = [s for s in steps if s.total_s > 0]
        if not steps:
            return None
        share = median([s.data_s / s.total_s for s in steps])
        data = median([s.data_s for s in steps])
        total = median([s.total_s for s in steps])
        return {"share": share, "data_s": data, "compute_s": max(total - data, 0.0), "total_s": total,
                "n": len(steps)}

    def evaluation_summary(self) -> dict | None:
        """The evaluation passes in sum: {passes, time_s, forwards, data_wait_s, batches} or None."""
        if not self.evaluations:
            return None
        return {"passes": len(self.evaluations), "time_s": sum(e.time_s for e in self.evaluations),
                "forwards": sum(e.forwards for e in self.evaluations),
                "data_wait_s": sum(e.data_wait_s for e in self.evaluations),
                "batches": sum(e.batches for e in self.evaluations)}

    def model(self, model_id: int) -> ModelInfo | None:
        for m in self.models:
            if m.id == model_id:
                return m
        return None
