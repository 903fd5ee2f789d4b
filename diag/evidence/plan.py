"""``Evidence.memory_plan``: the batch-size plan (diag memory; docs/memory.md)."""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class MemoryPlan(Section):
    """The plan assembled from a rank's ``memory.estimate`` for a target device."""
    status: str | None = None           # ok | none | skipped | failed
    reason: str | None = None           # why there is no plan
    target: Any = None                  # the device planned for (name, capacity [bytes])
    rank: int | None = None
    verdict: Any = None                 # fits / does not fit, with the numbers
    estimate: dict[str, Any] | None = None  # the rank's memory.estimate
    live: Any = None                    # what the run measured, for comparison
