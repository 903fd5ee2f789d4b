"""The device timeline (CUDA runs only): timing-enabled CUDA events recorded at the step boundaries
the probe sees, resolved lazily a few steps later, never a ``synchronize()`` on the hot path.

The probe records, diag judges: this module writes, per resolved step, how long the device took
between the boundaries (``phases``) and how long it sat idle in the intervals where the host queued
no GPU work (``idle``: waiting for data, host-to-device copies, the time between two steps). diag
(:mod:`diag.evidence.timeline`, ``diag.checks.api.data_wait``) turns that into shares and causes.

How idle is measured. A CUDA event completes when the stream reaches it, i.e. when every kernel
queued before it has run. For two events recorded around a host interval in which the host queued no
GPU work (a DataLoader ``__next__``, the code between two steps), ``elapsed_time(a, b)`` is exactly the
time the GPU sat idle in that interval: zero when the backlog of earlier kernels covered it (the wait
is *hidden*), the whole host interval when the queue was empty (the wait is *exposed*). Intervals in
which the host queues work (forward, backward, optimizer) count as busy: idle gaps between kernels
inside a phase (launch-bound code) are not separated (documented in docs/timeline.md).

Boundaries (labels of the marks): ``data_start`` / ``data_end`` around each DataLoader ``__next__``
(the probe's ``on_data`` hook), ``h2d_start`` / ``h2d_end`` around host-to-device ``.to()`` /
``.cuda()`` copies while the perf extension watches copies (:data:`diag.probe.perf.sync.COPY_LISTENERS`),
``forward_end`` (``on_forward``), ``optimizer_start`` (an optimizer pre-hook of this extension's own),
``step_start`` (``on_step_start``) and ``step_end`` (``on_step_end``). The interval after a mark is
named by the mark: see :data:`INTERVAL_AFTER`.

Cost: one ``Event(enable_timing=True)`` + ``record()`` per mark (a few µs; about 6 to 10 marks per
step), one ``query()`` per pending step per step end, ``elapsed_time`` only for completed steps.
Off with ``DIAG_TIMELINE=0`` (or ``DIAG_PROBE_DISABLE=timelineprobe``); never installed on a machine
without CUDA.

The logic (:class:`TimelineRecorder`) is written against a small clock interface (``record()``,
``query(handle)``, ``elapsed_ms(a, b)``) so that it runs on a scripted clock in the tests.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Any, Protocol

RING = 64               # steps waiting for their events to complete (older ones are dropped, counted)
KEEP_STEPS = 500        # resolved steps written to the evidence (the newest; totals cover all)
FLUSH_EVERY = 20        # totals are written every this many resolved steps (and at exit)
MAX_MARKS = 64          # marks kept per step (a step with more, e.g. a huge accumulation, is truncated)
EXIT_WAIT_S = 5.0       # at the end of the run: at most this long (polling, no synchronize) for pending steps

# What the host is doing after a mark, until the next one. "idle" intervals queue no GPU work, so
# the device time between their two events is GPU idle time.
INTERVAL_AFTER = {
    "step_start": "forward",        # the step opened: batch building, H2D, the forward
    "data_start": "data",           # waiting in DataLoader.__next__
    "data_end": "forward",          # batch building, .to(device), the forward
    "h2d_start": "h2d",             # a host-to-device copy
    "h2d_end": None,                # back to what was going on before the copy
    "forward_end": "backward",      # the loss and the backward pass (and anything until the optimizer)
    "optimizer_start": "optimizer",
    "step_end": "between",          # after the step: logging, .item(), evaluation, checkpointing
}
IDLE_INTERVALS = ("data", "h2d", "between")


class Clock(Protocol):
    """The event interface the timeline needs (CUDA events in the probe, a script in tests)."""

    def record(self) -> Any:
        """Record an event on the current stream now; return its handle (None: no event can be
        recorded now, e.g. during a CUDA graph capture; the mark is skipped)."""
        ...

    def query(self, handle: Any) -> bool:
        """Has the device reached the event (all work queued before it done)? Never blocks."""
        ...

    def elapsed_ms(self, a: Any, b: Any) -> float:
        """Device milliseconds between two completed events."""
        ...


class CudaClock:
    """Timing-enabled CUDA events on the current stream, reused once their step is resolved (creating
    and destroying a CUDA event per mark would cost more than recording it)."""

    POOL = 1024

    def __init__(self, torch):
        self._Event = torch.cuda.Event
        self._capturing = torch.cuda.is_current_stream_capturing
        self._free: list = []

    def record(self):
        if self._capturing():
            return None     # inside a CUDA graph capture an event would become part of the graph
        e = self._free.pop() if self._free else self._Event(enable_timing=True)
        e.record()
        return e

    def release(self, handle) -> None:
        if len(self._free) < self.POOL:
            self._free.append(handle)

    def query(self, handle) -> bool:
        return handle.query()

    def elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b)


class _PendingStep:
    __slots__ = ("index", "marks", "prev_end", "host", "eval_between")

    def __init__(self, index: int, prev_end):
        self.index = index
        self.marks: list = []           # (label, handle, host perf_counter)
        self.prev_end = prev_end        # (handle, host time) of the previous step's last mark, or None
        self.host: dict = {}            # host-side figures of the step (total_s, data_s, ...)
        self.eval_between = False


class TimelineRecorder:
    """Marks per step, a bounded ring of steps waiting for their events, lazy resolution.

    ``mark(label)`` records an event for the step in progress (marks before the first step opens
    are kept for it: a data-first loop fetches its batch before the probe opens the step).
    ``end_step(index, host)`` closes it into the ring; ``poll()`` resolves, oldest first, every
    step whose last event has completed (events complete in stream order) and returns the records.
    """

    def __init__(self, clock: Clock, ring: int = RING, now=time.perf_counter):
        self.clock = clock
        self.now = now
        self.ring: deque = deque()
        self.ring_size = ring
        self.current: _PendingStep | None = None
        self._prev_end = None
        self.dropped = 0            # steps dropped from a full ring before their events completed
        self.resolved = 0
        self.truncated = 0          # steps with more than MAX_MARKS marks
        self.totals = {"steps": 0, "device_s": 0.0, "busy_s": 0.0, "idle_s": 0.0,
                       "idle": {k: 0.0 for k in IDLE_INTERVALS}, "phases": {}}

    # ---- recording (hot path) ----------------------------------------------------------------------
    def mark(self, label: str) -> None:
        cur = self.current
        if cur is None:
            cur = self.current = _PendingStep(0, self._prev_end)
        if len(cur.marks) >= MAX_MARKS:
            if label != "step_end":
                return
            self.truncated += 1
            cur.marks.pop()
        h = self.clock.record()
        if h is not None:
            cur.marks.append((label, h, self.now()))

    def begin_step(self, index: int) -> None:
        cur = self.current
        if cur is None:
            cur = self.current = _PendingStep(index, self._prev_end)
        cur.index = index
        self.mark("step_start")

    def end_step(self, index: int, host: dict | None = None) -> None:
        self.mark("step_end")
        cur, self.current = self.current, None
        if not cur.marks:
            return          # no event could be recorded in this step (a CUDA graph replayed it all)
        cur.index = index or cur.index
        cur.host = host or {}
        last = cur.marks[-1]
        self._prev_end = (last[1], last[2])
        self.ring.append(cur)
        while len(self.ring) > self.ring_size:
            self.ring.popleft()
            self.dropped += 1

    # ---- resolution (a few steps later) ------------------------------------------------------------
    def poll(self) -> list[dict]:
        out = []
        while self.ring:
            st = self.ring[0]
            if not self.clock.query(st.marks[-1][1]):
                break           # not done yet: resolved at a later step end
            self.ring.popleft()
            rec = self._resolve(st)
            out.append(rec)
            self._add(rec)
            self._release(st)
        return out

    def _release(self, st: _PendingStep) -> None:
        """Hand the resolved step's events back to the clock for reuse: all but its last (the next
        step measures from it) and the previous step's last (no longer needed)."""
        release = getattr(self.clock, "release", None)
        if release is None:
            return
        if st.prev_end is not None:
            release(st.prev_end[0])
        for _label, h, _t in st.marks[:-1]:
            release(h)

    def _resolve(self, st: _PendingStep) -> dict:
        el = self.clock.elapsed_ms
        phases: dict[str, float] = {}
        idle = {k: 0.0 for k in IDLE_INTERVALS}
        marks = st.marks
        # the interval from the previous step's end to this step's first mark
        gap_ms = 0.0
        if st.prev_end is not None:
            gap_ms = max(el(st.prev_end[0], marks[0][1]), 0.0)
            if st.eval_between:
                between = "eval"          # evaluation ran there: GPU busy, not training
            elif marks[0][0] == "data_start":
                between = "between"       # no GPU work queued before the fetch: idle
            else:
                between = "forward"       # forward-first loop: the mark came after the forward was queued
            phases[between] = phases.get(between, 0.0) + gap_ms
            if between in idle:
                idle[between] += gap_ms
        stack: list[str] = []
        cur = None
        for (label, h, _t), (_nl, nh, _nt) in zip(marks, marks[1:]):
            nxt = INTERVAL_AFTER.get(label, "forward")
            if label == "h2d_start":
                stack.append(cur or "forward")
            elif label == "h2d_end":
                nxt = stack.pop() if stack else (cur or "forward")
            cur = nxt
            ms = max(el(h, nh), 0.0)
            phases[cur] = phases.get(cur, 0.0) + ms
            if cur in idle:
                idle[cur] += ms
        device_ms = sum(phases.values())
        idle_ms = sum(idle.values())
        host_s = marks[-1][2] - (st.prev_end[1] if st.prev_end is not None else marks[0][2])
        rec = {
            "index": st.index,
            "device_s": round(device_ms / 1e3, 7),
            "host_s": round(host_s, 7),
            "busy_s": round((device_ms - idle_ms) / 1e3, 7),
            "idle_s": round(idle_ms / 1e3, 7),
            "idle": {k: round(v / 1e3, 7) for k, v in idle.items() if v > 0},
            "phases": {k: round(v / 1e3, 7) for k, v in phases.items()},
            "marks": len(marks),
        }
        if st.host:
            rec["host"] = st.host
        return rec

    def _add(self, rec: dict) -> None:
        t = self.totals
        self.resolved += 1
        t["steps"] += 1
        t["device_s"] += rec["device_s"]
        t["busy_s"] += rec["busy_s"]
        t["idle_s"] += rec["idle_s"]
        ti, tp = t["idle"], t["phases"]
        for k, v in rec["idle"].items():
            ti[k] = ti.get(k, 0.0) + v
        for k, v in rec["phases"].items():
            tp[k] = tp.get(k, 0.0) + v

    def state(self) -> dict:
        t = self.totals
        totals = {"steps": t["steps"], "device_s": round(t["device_s"], 6), "busy_s": round(t["busy_s"], 6),
                  "idle_s": round(t["idle_s"], 6), "idle": {k: round(v, 6) for k, v in t["idle"].items()},
                  "phases": {k: round(v, 6) for k, v in t["phases"].items()}}
        return {"clock": "device", "resolved": self.resolved, "pending": len(self.ring),
                "dropped": self.dropped, "truncated": self.truncated, "ring": self.ring_size,
                "totals": totals}


def _r(x):
    return round(x, 7) if isinstance(x, float) else x


def enabled_by_env() -> bool:
    return os.environ.get("DIAG_TIMELINE", "1").strip().lower() not in ("0", "off", "false", "no")


class TimelineProbe:
    """The probe extension (CUDA runs only). On a machine without CUDA, or with ``DIAG_TIMELINE=0``,
    it removes itself at install: no hook of it is ever called."""

    def __init__(self, clock: Clock | None = None):
        self._clock = clock
        self.rec: TimelineRecorder | None = None
        self._on = False            # a CUDA model was seen: marks are recorded
        self._handles: list = []
        self._listener = None
        self._last_end_host = 0.0
        self._thread = None

    def install(self, ctx) -> None:
        if not enabled_by_env():
            ctx.disable(self)
            return
        clock = self._clock
        if clock is None:
            import torch

            if not torch.cuda.is_available():
                ctx.disable(self)       # CPU machine: zero cost, no hook ever called
                return
            clock = CudaClock(torch)
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._handles.append(register_optimizer_step_pre_hook(self._opt_pre))
        self.rec = TimelineRecorder(clock, now=getattr(clock, "now", time.perf_counter))
        self._thread = threading.get_ident()
        self._ctx = ctx
        from diag.probe.perf import sync as perf_sync

        self._listener = self._on_copy
        perf_sync.COPY_LISTENERS.append(self._listener)

    def uninstall(self, ctx) -> None:
        from diag.probe.hooks import remove_hooks
        from diag.probe.perf import sync as perf_sync

        remove_hooks(self._handles)
        self._handles = []
        if self._listener in perf_sync.COPY_LISTENERS:
            perf_sync.COPY_LISTENERS.remove(self._listener)
        self._on = False

    # ---- hooks -------------------------------------------------------------------------------------
    def on_model(self, ctx, module, info) -> None:
        if not self._on and any(str(d).startswith("cuda") for d in (info.get("devices") or [])):
            self._on = True
            ctx.emit("set", path="timeline.clock", value="device")

    def on_data(self, ctx, edge: str) -> None:
        rec = self.rec
        if not self._on or rec is None or not ctx.is_live():
            return
        if edge == "start" and rec.current is None and ctx.forward_start > self._last_end_host > 0:
            # a top-level forward ran since the last step ended and opened no step: evaluation
            rec.current = _PendingStep(0, rec._prev_end)
            rec.current.eval_between = True
        rec.mark("data_start" if edge == "start" else "data_end")

    def _on_copy(self, edge: str) -> None:
        # only the training thread's copies (a prefetching thread's would interleave with its marks)
        if self._on and self.rec is not None and threading.get_ident() == self._thread:
            self.rec.mark("h2d_start" if edge == "start" else "h2d_end")

    def _opt_pre(self, opt, args, kwargs):
        if self._on and self.rec is not None and self._ctx.is_live():
            try:
                self.rec.mark("optimizer_start")
            except Exception as e:
                self._ctx.report_error("TimelineProbe.optimizer", e)
        return None

    def on_step_start(self, ctx, index: int) -> None:
        if self._on and self.rec is not None:
            self.rec.begin_step(index)

    def on_forward(self, ctx, module, args, kwargs, output, training) -> None:
        if self._on and self.rec is not None:
            self.rec.mark("forward_end")

    def on_step_end(self, ctx, step) -> None:
        rec = self.rec
        if not self._on or rec is None:
            return
        rec.end_step(step.get("index", 0), {"total_s": _r(step.get("total_s")), "data_s": _r(step.get("data_s"))})
        self._last_end_host = rec.now()
        self._write(ctx, rec.poll())

    def on_exit(self, ctx, status) -> None:
        rec = self.rec
        if rec is None or not self._on:
            return
        # one bounded wait at the very end (not the hot path): let the last steps resolve
        deadline = time.perf_counter() + EXIT_WAIT_S
        done = rec.poll()
        while rec.ring and time.perf_counter() < deadline:
            time.sleep(0.005)
            done += rec.poll()
        self._write(ctx, done, force=True)

    def _write(self, ctx, records: list, force: bool = False) -> None:
        for r in records:
            ctx.emit("append", path="timeline.steps", value=r, limit=KEEP_STEPS)
        rec = self.rec
        if records and (force or any(r["index"] % FLUSH_EVERY == 0 or r["index"] <= 2 for r in records)) \
                or force:
            ctx.emit("merge", path="timeline", value=rec.state())


__all__ = ["CudaClock", "Clock", "IDLE_INTERVALS", "INTERVAL_AFTER", "KEEP_STEPS", "RING", "TimelineProbe",
           "TimelineRecorder", "enabled_by_env"]
