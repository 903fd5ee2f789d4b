"""``RankEvidence.evaluations``, ``framework`` and ``children``: the parts of a run that are not
training steps (evaluation passes), the training framework driving the loop, and training that ran
in child processes (docs/steps.md)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EvaluationPass:
    index: int = 0                  # 1-based pass number
    after_step: int = 0             # training steps completed before the pass
    start_s: float = 0.0            # seconds since the rank's probe started, at the pass's start
    time_s: float = 0.0             # the whole pass (from the previous step's end to the next step's start)
    forwards: int = 0               # top-level forwards that did not train (evaluation, inference)
    forward_s: float = 0.0          # time in those forwards
    data_wait_s: float = 0.0        # waiting in DataLoader.__next__ for evaluation batches
    batches: int = 0                # evaluation batches fetched
    loaders: list[int] = field(default_factory=list)  # DataLoaderInfo ids of the evaluation loaders


@dataclass
class EvalStepRecord:
    """One evaluation step: one forward of the model on one batch (docs/steps.md, section 5).
    ``data_s + h2d_s + forward_s + other_s == total_s``."""
    index: int = 0                  # 1-based evaluation step number over the run
    pass_index: int = 0             # the evaluation pass it belongs to (EvaluationPass.index)
    t: float = 0.0                  # seconds since the rank's probe started, at the step's end
    total_s: float = 0.0            # from the previous evaluation step's end (or the pass's start) to this one's end
    data_s: float = 0.0             # waiting in DataLoader.__next__ for this step's batch
    h2d_s: float = 0.0              # host-to-device copies of the batch (Tensor.to/.cuda to a CUDA device) before the forward
    forward_s: float = 0.0          # the step's evaluation forwards
    other_s: float = 0.0            # the rest: post-processing between forwards (metrics, .item(), logging)
    forwards: int = 0               # forwards in the step (several models or call sites on one batch)
    samples: int | None = None      # the batch: dim 0 of the first forward's input
    tokens: int | None = None       # samples x sequence length, for integer (token) inputs
    site: str | None = None         # ForwardSite.key of the step's first forward
    host_syncs: int = 0             # .item()/.tolist()/.cpu()/.numpy() calls outside the forward (per-batch host syncs)
    instrumented: bool = False      # its forward ran under FlopCounterMode (flops.eval): left out of timing


@dataclass
class EvalStepStats:
    """Aggregates over every evaluation step (not just the kept ones); timing, samples and tokens
    sum the timed steps (an instrumented one left out)."""
    count: int = 0                  # evaluation steps observed
    timed: int = 0                  # steps in the sums below
    total_s: float = 0.0
    data_s: float = 0.0
    h2d_s: float = 0.0
    forward_s: float = 0.0
    other_s: float = 0.0
    forwards: int = 0
    samples: int = 0
    tokens: int = 0
    host_syncs: int = 0             # host syncs over every evaluation step
    steps_with_syncs: int = 0       # evaluation steps with at least one host sync
    sync_sites: list[dict] = field(default_factory=list)  # where they were called ({file, line, function, calls, op}), top 10


@dataclass
class FrameworkInfo:
    name: str = ""                  # transformers, lightning, accelerate
    version: str | None = None      # the package's version
    entry: dict | None = None       # the user's line that called into the framework ({file, line, function})


@dataclass
class ChildProcess:
    pid: int = 0                    # process id of the child
    start_method: str | None = None  # fork, spawn or forkserver
    steps: int = 0                  # training steps the child completed
    forwards: int = 0               # training forwards in the child
    samples: int = 0                # samples over its steps
    time_s: float = 0.0             # the child's time from its first step's start to its last step's end
    median_step_s: float | None = None  # median step time in the child
    status: str | None = None       # completed, failed, ...
