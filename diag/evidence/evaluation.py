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
