"""``RankEvidence.sync``: host-device synchronisations (CUDA training only), counted with torch's sync
debug mode over a window of steps."""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class SyncSection(Section):
    """Synchronisations per step over the sampling window (``RankEvidence.sync``)."""
    state: str | None = None            # sampling | done | "not sampled: ..." | "unavailable: ..."
    mode: Any = None                    # the sync debug mode found before the window
    first_step: int | None = None       # the window opened after this step
    last_step: int | None = None        # the last step counted
    steps: int | None = None            # steps counted
    total: int | None = None            # synchronisations counted in the window
    per_step: list[int] | None = None   # synchronisations of each counted step
    sites: list[dict[str, Any]] | None = None  # where they happened in the user's code (top 10)
