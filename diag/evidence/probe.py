"""``RankEvidence.probe``: what diag's probe cost the process it observed (issue 20). Per step, the
probe's own time is ``StepRecord.probe_s``; this section is the run's total by part, written when the
script ends. The share of the median step is computed by :mod:`diag.probe_cost`."""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class ProbeSection(Section):
    """The probe's own time over the whole run (seconds), and its hook hand-over."""
    own_s: float | None = None              # the probe's own time: hook bodies, extensions, event writes (s)
    by_part: dict[str, Any] | None = None   # own_s by part: hooks, sink, and each extension's class name (s)
    slow_path_us_per_call: float | None = None  # torch's cost of a global hook pair per module call here (µs)
    handover: bool | None = None            # hooks handed over to the outermost modules (false: global hooks throughout)
    windows: int | None = None              # discovery windows opened (global hooks for about one step each)
    window_reasons: dict[str, Any] | None = None  # windows by reason (install, loader, periodic, ...)
    handovers: int | None = None            # times the global hooks were handed over to module hooks
    hooked_modules: int | None = None       # modules carrying the probe's own hooks at the end
