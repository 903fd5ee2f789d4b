"""``RankEvidence.steps`` and ``step_stats``: training steps, timed by phase (seconds)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepRecord:
    index: int = 0              # 1-based training step number
    t: float = 0.0              # seconds since the rank's probe started, at the step's end
    total_s: float = 0.0                  # the whole step
    data_s: float = 0.0         # waiting in DataLoader.__next__
    forward_s: float = 0.0      # top-level training forwards
    backward_s: float = 0.0               # from the first gradient reaching the model's output to the end of the backward pass
    optimizer_s: float = 0.0              # optimizer.step()
    other_s: float = 0.0        # the rest (loss, logging, hand-made batching, ...)
    n_forward: int = 0                    # training forwards in the step
    n_backward: int = 0                   # backward passes in the step
    samples: int | None = None  # the step's batch: dim 0 of its first training forward's input, summed
                                # over its micro-batches (every training forward at that call site)
    tokens: int | None = None   # samples x sequence length, for integer (token) inputs
    micro_batches: int | None = None  # forwards summed into samples (gradient accumulation: > 1)
    epoch: int | None = None
    ended_by: str = "optimizer"  # optimizer: ended by optimizer.step(); manual: ended after backward()
    instrumented: bool = False  # a step diag slowed on purpose (FLOP counting): excluded from timing stats
    extra: dict[str, Any] = field(default_factory=dict)  # per-step values from probe extensions
    probe_s: float | None = None          # diag's probe's own time since the previous step event (its hooks, extensions, event writes)
    probe_window: bool = False            # a hook discovery window covered the step (global hooks on every module call)
    sampled: bool = True                  # the probe did its per-step extras on it (device timeline, allocator reads, extension values in extra); false: core timing only (its cost budget; absent in older evidence: true)

    @property
    def batch(self) -> int | None:
        """The batch of one forward (a micro-batch under gradient accumulation): what activation
        memory scales with."""
        if not self.samples:
            return None
        return max(1, self.samples // self.micro_batches) if self.micro_batches else self.samples


@dataclass
class StepStats:
    """Aggregates over every step (not just the kept ones)."""
    count: int = 0                        # steps observed
    timed: int = 0              # steps included in the sums (not instrumented)
    total_s: float = 0.0                  # sum over the timed steps
    data_s: float = 0.0                   # sum over the timed steps
    forward_s: float = 0.0                # sum over the timed steps
    backward_s: float = 0.0               # sum over the timed steps
    optimizer_s: float = 0.0              # sum over the timed steps
    other_s: float = 0.0                  # sum over the timed steps
    samples: int = 0                      # sum over every step
    tokens: int = 0                       # sum over every step
