"""``RankEvidence.steps`` and ``step_stats``: training steps, timed by phase (seconds)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepRecord:
    index: int = 0              # 1-based training step number
    t: float = 0.0              # seconds since the rank's probe started, at the step's end
    total_s: float = 0.0
    data_s: float = 0.0         # waiting in DataLoader.__next__
    forward_s: float = 0.0      # top-level training forwards
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    other_s: float = 0.0        # the rest (loss, logging, hand-made batching, ...)
    n_forward: int = 0
    n_backward: int = 0
    samples: int | None = None  # the step's batch: dim 0 of its first training forward's input, summed
                                # over its micro-batches (every training forward at that call site)
    tokens: int | None = None   # samples x sequence length, for integer (token) inputs
    micro_batches: int | None = None  # forwards summed into samples (gradient accumulation: > 1)
    epoch: int | None = None
    ended_by: str = "optimizer"  # optimizer: ended by optimizer.step(); manual: ended after backward()
    instrumented: bool = False  # a step diag slowed on purpose (FLOP counting): excluded from timing stats
    extra: dict[str, Any] = field(default_factory=dict)  # per-step values from probe extensions

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
    count: int = 0
    timed: int = 0              # steps included in the sums (not instrumented)
    total_s: float = 0.0
    data_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    other_s: float = 0.0
    samples: int = 0
    tokens: int = 0
