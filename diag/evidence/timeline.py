"""``RankEvidence.timeline``: the device timeline of a CUDA run (diag.probe.timeline), CUDA events
resolved lazily. Absent (empty) on CPU runs and when the timeline was switched off (``DIAG_TIMELINE=0``).

A step record in ``steps`` has: ``index``; ``device_s`` (device time from the previous step's last
event to this step's last one); ``host_s`` (the same span on the host clock); ``busy_s`` / ``idle_s``
(GPU busy and idle in that span); ``idle`` (idle seconds by the interval they fell in: ``data`` waiting
for a batch, ``h2d`` host-to-device copies, ``between`` the code between two steps: logging, ``.item()``,
checkpointing); ``phases`` (device seconds per interval: ``data``, ``forward`` (batch building, copies
and the forward), ``backward`` (loss and backward), ``optimizer``, ``h2d``, ``between``, ``eval``
(evaluation between two steps: GPU busy, not training)); ``marks`` (events recorded); ``host`` (the
probe's host-clock ``total_s`` and ``data_s`` of the step).
"""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class TimelineSection(Section):
    """Per-step device durations and GPU idle time (``RankEvidence.timeline``)."""
    clock: str | None = None            # "device" (CUDA events) when recorded; null: no device timeline
    resolved: int | None = None         # steps whose events completed and were measured
    pending: int | None = None          # steps still waiting for their events when last written
    dropped: int | None = None          # steps dropped from the full ring before their events completed
    truncated: int | None = None        # steps with more marks than kept (their middle marks merged)
    ring: int | None = None             # the ring's size (steps)
    totals: dict[str, Any] | None = None  # sums over every resolved step: steps, device_s, busy_s, idle_s,
                                        # idle {cause: s}, phases {interval: s}
    steps: list[dict[str, Any]] | None = None  # the newest resolved steps (see the module doc), at most 500
