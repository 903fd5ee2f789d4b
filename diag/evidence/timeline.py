"""``RankEvidence.timeline``: the device timeline of a CUDA run (diag.probe.timeline), CUDA events
resolved lazily. Absent (empty) on CPU runs and when the timeline was switched off (``DIAG_TIMELINE=0``).

Only the steps the probe sampled (``StepRecord.sampled``; its cost budget) have a record; a sampled
step after an unsampled one is measured from the unsampled step's end (one mark there). A step record
in ``steps`` has: ``index``; ``device_s`` (device time from the previous step's last
event to this step's last one); ``host_s`` (the same span on the host clock); ``busy_s`` / ``idle_s``
(GPU busy and idle in that span); ``idle`` (idle seconds by the interval they fell in: ``data`` waiting
for a batch, ``h2d`` host-to-device copies from pageable memory, ``h2d_pinned`` from pinned memory,
``between`` the code between two steps (logging, ``.item()``), ``ckpt`` inside ``torch.save`` /
safetensors' save, ``eval`` inside an evaluation pass of the step model before this step);
``phases`` (device seconds per interval: ``data``, ``forward`` (batch building and the forward),
``backward`` (loss and backward), ``optimizer``, ``h2d``, ``h2d_pinned``, ``between``, ``ckpt``,
``eval`` (the evaluation pass before this step, busy and idle)); ``marks`` (events recorded);
``copies`` (only for a step inside the copy window, where every copy was timed: ``watched``,
``pageable_n``, ``pageable_bytes``, ``pinned_n``, ``pinned_bytes``); ``host`` (the probe's host-clock
``total_s`` and ``data_s`` of the step).
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
    unsampled: int | None = None        # steps the probe did not sample (its cost budget): not device-timed, no record
    totals: dict[str, Any] | None = None  # sums over every resolved step: steps, device_s, busy_s, idle_s,
                                        # idle {cause: s}, phases {interval: s}
    steps: list[dict[str, Any]] | None = None  # the newest resolved steps (see the module doc), at most 500
    copies: dict[str, Any] | None = None  # copies over the copy window's resolved steps: steps, device_s,
                                        # pageable/pinned {n, bytes, s}, window (what the sampling covers)
