"""``RankEvidence.amp``: mixed precision as the perf probe extension saw it."""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class AmpSection(Section):
    """GradScaler use (``RankEvidence.amp``)."""
    scaler: dict[str, Any] | None = None  # GradScaler: created, enabled, scale()/step() calls, device, where
