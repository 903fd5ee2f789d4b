"""``Evidence.ranks[i]``: everything observed in one process."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diag.evidence._schema import median
from diag.evidence.amp import AmpSection
from diag.evidence.dataloaders import DataLoaderInfo
from diag.evidence.distributed import DistributedSection
from diag.evidence.evaluation import ChildProcess, EvalStepRecord, EvalStepStats, EvaluationPass, FrameworkInfo
from diag.evidence.extras import ExtrasSection
from diag.evidence.flops import FlopsSection
from diag.evidence.memory import MemorySection
from diag.evidence.models import ForwardSite, ModelInfo, OptimizerInfo
from diag.evidence.phases import COMM, EVAL_FIELDS, STEP_FIELDS, steady_steps
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
    eval_steps: list[EvalStepRecord] = field(default_factory=list)  # evaluation steps (one forward on one batch), newest MAX_STEPS_KEPT
    eval_stats: EvalStepStats = field(default_factory=EvalStepStats)  # sums over every evaluation step
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
    def timed_steps(self, skip_warmup: int | None = None, sampled: bool = False) -> list[StepRecord]:
        """The steady steps of the kept ones (:func:`diag.evidence.phases.steady_steps`: instrumented
        steps and the warm-up dropped; ``skip_warmup``: drop that many first steps instead of the
        rule's warm-up; ``sampled``: only the steps the probe sampled, for a figure that reads the
        probe's per-step extras)."""
        return steady_steps(self.steps, skip_warmup, sampled)

    def median_step(self, skip_warmup: int | None = None) -> dict[str, float] | None:
        """Median of each phase over the timed steps (None without steps)."""
        steps = self.timed_steps(skip_warmup)
        if not steps:
            return None
        out = {}
        for name in STEP_FIELDS:
            out[name] = median([getattr(s, name) for s in steps])
        # DDP: the time waiting in collectives (extra.comm_wait_s) is a phase of its own, apart from the
        # five above; every report shows it so that the phases add up to the step
        # (read on the sampled steps: a per-step value an extension may write on those only)
        comm = [float((s.extra or {}).get("comm_wait_s") or 0.0) for s in steps if s.sampled]
        if any(comm):
            out[COMM.field] = median(comm)
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
        steps of each step's data wait / step time (the warm-up out: diag.evidence.phases; with
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

    def run_kind(self) -> str:
        """What this process did, from what was observed: ``training`` (training steps, no
        evaluation), ``evaluation`` (forwards that did not train and no training step: an evaluation
        or batch-inference script), ``training+evaluation`` (training with evaluation passes between
        its steps) or ``none`` (no model forward at all)."""
        trained = self.step_stats.count > 0 or any(c.steps for c in self.children)
        evaluated = bool(self.evaluations) or self.eval_stats.count > 0 or any(
            s.count > 0 and not s.in_step and not s.backpropagated for s in self.forwards)
        if not trained and not evaluated and self.backward_calls == 0 and not any(o.steps for o in self.optimizers):
            # forwards that look like training (train mode, grad enabled) but never reached a backward
            # or an optimizer: an evaluation done in train mode without no_grad
            evaluated = any(s.count > 0 for s in self.forwards)
        if trained and evaluated and not self.evaluations and self.eval_stats.count == 0:
            evaluated = False   # evaluation-looking forwards inside training steps (a teacher): training
        if trained:
            return "training+evaluation" if evaluated else "training"
        return "evaluation" if evaluated else "none"

    def eval_forward_sites(self) -> list[ForwardSite]:
        """The forward sites that evaluated (not training), most-called first."""
        sites = [s for s in self.forwards if s.count > 0 and not s.in_step and not s.backpropagated]
        if not sites and self.run_kind() == "evaluation":
            sites = [s for s in self.forwards if s.count > 0]
        return sorted(sites, key=lambda s: -s.count)

    def eval_loaders(self) -> list[DataLoaderInfo]:
        """The DataLoaders whose batches fed evaluation (role eval); in an evaluation-only run without
        roles, every loader that delivered batches."""
        loaders = [d for d in self.dataloaders if d.role == "eval" and d.batches > 0]
        if not loaders and self.run_kind() == "evaluation":
            loaders = [d for d in self.dataloaders if d.batches > 0]
        return loaders

    def eval_throughput(self) -> dict | None:
        """Evaluation throughput from the evaluation steps: {steps, time_s, samples, tokens,
        batches_per_s, samples_per_s, tokens_per_s, median_step_s, phases: median of each phase,
        data_share} over the steady evaluation steps (diag.evidence.phases), or None without them."""
        st = self.eval_stats
        if st.count == 0 or st.total_s <= 0:
            return None
        timed_n = st.timed or st.count
        timed = steady_steps(self.eval_steps)
        med = {name: median([getattr(s, name) for s in timed]) for name in EVAL_FIELDS} if timed else None
        shares = [s.data_s / s.total_s for s in timed if s.total_s > 0]
        return {"steps": st.count, "timed": timed_n, "time_s": st.total_s, "samples": st.samples,
                "tokens": st.tokens, "batches_per_s": timed_n / st.total_s,
                "samples_per_s": st.samples / st.total_s if st.samples else None,
                "tokens_per_s": st.tokens / st.total_s if st.tokens else None,
                "median_step_s": med["total_s"] if med else None, "phases": med,
                "data_share": median(shares) if shares else None,
                "forward_share": st.forward_s / st.total_s}

    def eval_share(self) -> dict | None:
        """For a training run with periodic evaluation: {eval_s (the passes' time), train_s (the
        training steps' time), share (eval_s / (eval_s + train_s)), passes, steps, every (median
        training steps between two passes), per_pass_s and step_s (means over the run: they
        reproduce ``share``), median_pass_s, median_step_s}; None without both."""
        if not self.evaluations or self.step_stats.count == 0 or self.step_stats.total_s <= 0:
            return None
        eval_s = sum(e.time_s for e in self.evaluations)
        train_s = self.step_stats.total_s
        med = self.median_step()
        afters = [e.after_step for e in self.evaluations]
        gaps = [b - a for a, b in zip(afters, afters[1:]) if b > a]
        return {"eval_s": eval_s, "train_s": train_s, "share": eval_s / (eval_s + train_s),
                "passes": len(self.evaluations), "steps": self.step_stats.count,
                "every": median(gaps) if gaps else None,
                "per_pass_s": eval_s / len(self.evaluations),
                "step_s": train_s / max(self.step_stats.timed, 1),
                "median_pass_s": median([e.time_s for e in self.evaluations]),
                "median_step_s": (med or {}).get("total_s")}

    def model(self, model_id: int) -> ModelInfo | None:
        for m in self.models:
            if m.id == model_id:
                return m
        return None
