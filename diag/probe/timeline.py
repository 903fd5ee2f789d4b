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
(the probe's ``on_data`` hook), ``h2d_start`` (pageable source) or ``h2d_pinned_start`` (pinned
source) / ``h2d_end`` around host-to-device copies (``.to()``, ``.cuda()``, ``copy_`` into a CUDA
tensor) while the perf extension watches copies (its window of ``SYNC_STEPS`` steps:
:data:`diag.probe.perf.sync.COPY_LISTENERS`), ``ckpt_start`` / ``ckpt_end`` around ``torch.save`` (and
safetensors' ``save_file`` / ``save_model`` when installed; only timed, never altered),
``forward_end`` (``on_forward``), ``optimizer_start`` (an optimizer pre-hook of this extension's own),
``step_start`` (``on_step_start``) and ``step_end`` (``on_step_end``). The interval after a mark is
named by the mark: see :data:`INTERVAL_AFTER`. Intervals before a step's training began that fall in
an evaluation pass of the step model (``diag.probe.steps``: the pass ends where the next training
step's fetch begins) are ``eval``: busy or idle, the idle part attributed to evaluation.

Cost: one ``Event(enable_timing=True)`` + ``record()`` per mark (a few µs; about 6 to 10 marks per
step), one ``query()`` per pending step per step end, ``elapsed_time`` only for completed steps.
Copies are marked only inside the copy window (20 steps; two marks, one ``is_pinned()`` and a stream
comparison per copy; the step records of that window carry ``copies``); a save costs two marks.
Off with ``DIAG_TIMELINE=0`` (or ``DIAG_PROBE_DISABLE=timelineprobe``); never installed on a machine
without CUDA.

The logic (:class:`TimelineRecorder`) is written against a small clock interface (``record()``,
``query(handle)``, ``elapsed_ms(a, b)``) so that it runs on a scripted clock in the tests.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from collections import deque
from typing import Any, Protocol
from diag.evidence import events as E

RING = 64               # steps waiting for their events to complete (older ones are dropped, counted)
KEEP_STEPS = 500        # resolved steps written to the evidence (the newest; totals cover all)
FLUSH_EVERY = 20        # totals are written every this many resolved steps (and at exit)
MAX_MARKS = 64          # marks kept per step (a step with more, e.g. a huge accumulation, is truncated)
POLL_EVERY = 8          # completed steps are resolved in batches: every this many steps (and steps 1-2),
POLL_MAX_S = 1.0        # or when this long has passed since the last resolution (long steps: the TUI stays live)
EXIT_WAIT_S = 5.0       # at the end of the run: at most this long (polling, no synchronize) for pending steps
# copies are timed only inside the perf extension's copy watch (a sampling window: its SYNC_STEPS steps)
COPY_WINDOW = "copies timed only inside the copy-watch window (20 steps after the first; not under torch.compile)"

# What the host is doing after a mark, until the next one. "idle" intervals queue no GPU work, so
# the device time between their two events is GPU idle time.
INTERVAL_AFTER = {
    "step_start": "forward",        # the step opened: batch building, H2D, the forward
    "data_start": "data",           # waiting in DataLoader.__next__
    "data_end": "forward",          # batch building, .to(device), the forward
    "h2d_start": "h2d",             # a host-to-device copy from pageable memory
    "h2d_pinned_start": "h2d_pinned",   # a host-to-device copy from pinned memory
    "h2d_end": None,                # back to what was going on before the copy
    "ckpt_start": "ckpt",           # torch.save / safetensors save: checkpointing
    "ckpt_end": None,               # back to what was going on before the save
    "forward_end": "backward",      # the loss and the backward pass (and anything until the optimizer)
    "optimizer_start": "optimizer",
    "step_end": "between",          # after the step: logging, .item(), evaluation, checkpointing
}
NESTED = {"h2d_start", "h2d_pinned_start", "ckpt_start"}     # intervals that return to the one around them
NESTED_END = {"h2d_end", "ckpt_end"}
# marks recorded after the step's first forward was queued: a step whose first mark is one of these
# (a forward-first loop) has the forward, not idle time, between the previous step and that mark
AFTER_FORWARD = {"step_start", "forward_end", "optimizer_start", "step_end"}
IDLE_INTERVALS = ("data", "h2d", "h2d_pinned", "between", "ckpt", "eval")
COPY_KINDS = ("pageable", "pinned")


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
    and destroying a CUDA event per mark would cost more than recording it).

    The current stream is told by its key (one C call: ``torch._C._cuda_getCurrentStream``), and its
    ``Stream`` object is made once per stream: ``torch.cuda.current_stream()``, which
    ``Event.record()`` calls when given no stream, builds a new ``Stream`` under a device guard each
    time, several times a step (issue 20: the timeline was ~260 µs of an H200 step)."""

    POOL = 1024
    STREAMS = 64                # Stream objects kept (a job uses a handful)

    def __init__(self, torch):
        self._Event = torch.cuda.Event
        self._capturing = torch.cuda.is_current_stream_capturing
        self._current = torch.cuda.current_stream
        C = getattr(torch, "_C", None)
        self._key = getattr(C, "_cuda_getCurrentStream", None)
        self._device = getattr(C, "_cuda_getDevice", None)
        if self._key is None or self._device is None:
            self._key = self._device = None       # (another torch) the Stream object is its own key
        self._streams: dict = {}    # stream key -> Stream
        self._stream = None         # the key of the first mark's stream: the training stream
        self._free: list = []

    def _now(self):
        """(key, Stream) of the current stream."""
        if self._key is None:
            s = self._current()
            return s, s
        key = self._key(self._device())
        s = self._streams.get(key)
        if s is None:
            s = self._current()
            if len(self._streams) < self.STREAMS:
                self._streams[key] = s
        return key, s

    def record(self):
        if self._capturing():
            return None     # inside a CUDA graph capture an event would become part of the graph
        key, stream = self._now()
        if self._stream is None:
            self._stream = key
        e = self._free.pop() if self._free else self._Event(enable_timing=True)
        e.record(stream)
        return e

    def same_stream(self) -> bool:
        """Is the current stream the training stream? (asked per copy, inside the copy window only)"""
        return self._stream is None or self._now()[0] == self._stream

    def release(self, handle) -> None:
        if len(self._free) < self.POOL:
            self._free.append(handle)

    def query(self, handle) -> bool:
        return handle.query()

    def elapsed_ms(self, a, b) -> float:
        return a.elapsed_time(b)


class _PendingStep:
    __slots__ = ("index", "marks", "prev_end", "host", "gap_forward", "eval_until", "copies", "watched")

    def __init__(self, index: int, prev_end):
        self.index = index
        self.marks: list = []           # (label, handle, host perf_counter)
        self.prev_end = prev_end        # (handle, host time) of the previous step's last mark, or None
        self.host: dict = {}            # host-side figures of the step (total_s, data_s, ...)
        self.gap_forward = False        # a forward ran between the previous step and this step's first mark
        self.eval_until = None          # host time an evaluation pass before this step ended (None: no pass)
        self.copies = None              # [pageable n, bytes, pinned n, bytes] of the copies marked
        self.watched = False            # every host-to-device copy of the step was seen (the copy window)


class TimelineRecorder:
    """Marks per step, a bounded ring of steps waiting for their events, lazy resolution.

    ``mark(label)`` records an event for the step in progress (marks before the first step opens
    are kept for it: a data-first loop fetches its batch before the probe opens the step).
    ``end_step(index, host)`` closes it into the ring; ``poll()`` resolves, oldest first, every
    step whose last event has completed (events complete in stream order) and returns the records.
    """

    def __init__(self, clock: Clock, ring: int = RING, now=time.perf_counter, opened=None):
        self.clock = clock
        self.opened = opened        # called with each new pending step (the probe notes what ran before it)
        self.now = now
        self.ring: deque = deque()
        self.ring_size = ring
        self.current: _PendingStep | None = None
        self._prev_end = None
        self.prev_index: int | None = None  # the step whose last mark is _prev_end
        self.unsampled = 0          # steps the probe did not sample: no marks, no record (its cost budget)
        self.dropped = 0            # steps dropped from a full ring before their events completed
        self.resolved = 0
        self.truncated = 0          # steps with more than MAX_MARKS marks
        self.totals = {"steps": 0, "device_s": 0.0, "busy_s": 0.0, "idle_s": 0.0,
                       "idle": {k: 0.0 for k in IDLE_INTERVALS}, "phases": {}}
        # copies over the steps whose copies were all watched: steps, device s, n, bytes per kind
        self.copy_totals = {"steps": 0, "device_s": 0.0,
                            **{k: {"n": 0, "bytes": 0, "s": 0.0} for k in COPY_KINDS}}

    # ---- recording (hot path) ----------------------------------------------------------------------
    def pending(self) -> _PendingStep:
        cur = self.current
        if cur is None:
            cur = self.current = _PendingStep(0, self._prev_end)
            if self.opened is not None:
                self.opened(cur)
        return cur

    def mark(self, label: str) -> bool:
        cur = self.current
        if cur is None:
            cur = self.pending()
        if len(cur.marks) >= MAX_MARKS:
            if label != "step_end":
                return False
            self.truncated += 1
            cur.marks.pop()
        h = self.clock.record()
        if h is not None:
            cur.marks.append((label, h, self.now()))
            return True
        return False

    def copy(self, pinned: bool, nbytes: int) -> None:
        """One host-to-device copy of ``nbytes`` (from pinned memory or not) in the step in progress."""
        cur = self.pending()
        c = cur.copies
        if c is None:
            c = cur.copies = [0, 0, 0, 0]
        i = 2 if pinned else 0
        c[i] += 1
        c[i + 1] += nbytes

    def begin_step(self, index: int, eval_until: float | None = None) -> None:
        cur = self.pending()
        cur.index = index
        if eval_until is not None:
            cur.eval_until = eval_until
        self.mark("step_start")

    def end_step(self, index: int, host: dict | None = None, watched: bool = False) -> None:
        self.mark("step_end")
        cur, self.current = self.current, None
        if not cur.marks:
            return          # no event could be recorded in this step (a CUDA graph replayed it all)
        cur.index = index or cur.index
        cur.host = host or {}
        # a truncated step lost marks (a copy's end, maybe): its copies are not measured
        cur.watched = watched and len(cur.marks) < MAX_MARKS
        last = cur.marks[-1]
        self._prev_end = (last[1], last[2])
        self.prev_index = cur.index
        self.ring.append(cur)
        while len(self.ring) > self.ring_size:
            self.ring.popleft()
            self.dropped += 1

    def skip(self, index: int, mark_end: bool) -> None:
        """A step the probe did not sample: nothing recorded, unless the next step is sampled
        (``mark_end``): then one mark at this step's end, which the next step measures its gap from
        (the code between two steps: logging, ``.item()``, a sync)."""
        self.unsampled += 1
        if not mark_end:
            return
        h = self.clock.record()
        if h is not None:
            self._prev_end = (h, self.now())
            self.prev_index = index
        else:
            self._prev_end = None

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
        until = st.eval_until

        def add(name: str, ms: float, start_t: float) -> None:
            if until is not None and start_t < until and name != "ckpt":
                # inside the evaluation pass before this step: evaluation's, busy or idle
                phases["eval"] = phases.get("eval", 0.0) + ms
                if name in idle:
                    idle["eval"] += ms
                return
            phases[name] = phases.get(name, 0.0) + ms
            if name in idle:
                idle[name] += ms

        # the interval from the previous step's end to this step's first mark: idle (the host queued
        # nothing) unless a forward was queued in it (an evaluation forward, or a forward-first loop)
        gap = "between"
        if st.prev_end is not None:
            if st.gap_forward or marks[0][0] in AFTER_FORWARD:
                gap = "forward"
            add(gap, max(el(st.prev_end[0], marks[0][1]), 0.0), st.prev_end[1])
        stack: list[str] = []
        cur = gap if gap == "between" else None
        for (label, h, t), (_nl, nh, _nt) in zip(marks, marks[1:]):
            nxt = INTERVAL_AFTER.get(label, "forward")
            if label in NESTED:
                stack.append(cur or "forward")
            elif label in NESTED_END:
                nxt = stack.pop() if stack else (cur or "forward")
            if (nxt == "between" or nxt == "data") and _nl in AFTER_FORWARD:
                # a forward-first loop queued its forward before this mark (after the code between
                # steps, or after a loader's StopIteration): not idle
                nxt = "forward"
            cur = nxt
            add(cur, max(el(h, nh), 0.0), t)
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
        if st.watched:
            c = st.copies or [0, 0, 0, 0]
            rec["copies"] = {"watched": True, "pageable_n": c[0], "pageable_bytes": c[1],
                             "pinned_n": c[2], "pinned_bytes": c[3]}
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
        c = rec.get("copies")
        if c:
            ct = self.copy_totals
            ct["steps"] += 1
            ct["device_s"] += rec["device_s"]
            for kind, phase in (("pageable", "h2d"), ("pinned", "h2d_pinned")):
                ct[kind]["n"] += c[f"{kind}_n"]
                ct[kind]["bytes"] += c[f"{kind}_bytes"]
                ct[kind]["s"] += rec["phases"].get(phase, 0.0)

    def state(self) -> dict:
        t = self.totals
        totals = {"steps": t["steps"], "device_s": round(t["device_s"], 6), "busy_s": round(t["busy_s"], 6),
                  "idle_s": round(t["idle_s"], 6), "idle": {k: round(v, 6) for k, v in t["idle"].items()},
                  "phases": {k: round(v, 6) for k, v in t["phases"].items()}}
        ct = self.copy_totals
        copies = {"steps": ct["steps"], "device_s": round(ct["device_s"], 6), "window": COPY_WINDOW,
                  **{k: {"n": ct[k]["n"], "bytes": ct[k]["bytes"], "s": round(ct[k]["s"], 6)} for k in COPY_KINDS}}
        return {"clock": "device", "resolved": self.resolved, "pending": len(self.ring),
                "dropped": self.dropped, "truncated": self.truncated, "ring": self.ring_size,
                "unsampled": self.unsampled, "totals": totals, "copies": copies}


def _sampled(ctx) -> bool:
    """``ctx.sampled`` (True for a context without it: a stand-in, or a probe before issue 28)."""
    return getattr(ctx, "sampled", True)


def _r(x):
    return round(x, 7) if isinstance(x, float) else x


def enabled_by_env() -> bool:
    return os.environ.get("DIAG_TIMELINE", "1").strip().lower() not in ("0", "off", "false", "no")


class TimelineProbe:
    """The probe extension (CUDA runs only). On a machine without CUDA, or with ``DIAG_TIMELINE=0``,
    it removes itself at install: no hook of it is ever called. Its marks are recorded on the steps
    the probe samples only (``ctx.sampled``; the probe's cost budget, docs/probe.md)."""

    SAMPLED_EXTRAS = True       # honours ctx.sampled: the probe's budget decides which steps it times
    # the probe's lane (diag.probe.lane) may skip its hooks on unsampled steps: they record nothing there.
    # The lane calls on_step_end on the last unsampled step before a sampled one (its end mark); the
    # steps it skipped are counted unsampled from the step indexes
    LANE = True

    def __init__(self, clock: Clock | None = None):
        self._clock = clock
        self.rec: TimelineRecorder | None = None
        self._on = False            # a CUDA model was seen: marks are recorded
        self._handles: list = []
        self._patches = None
        self._listener = None
        self._last_end_host = 0.0
        self._last_poll_host = 0.0      # host time of the last resolution (POLL_MAX_S)
        self._thread = None
        self._ctx = None
        self._copy_open = False     # the start of the copy in progress was marked
        self._ckpt_depth = 0
        self._evals_seen = 0        # evaluation passes of the step model already attributed
        self.copy_watch: dict = {"on": False}   # the perf extension's copy-watch flag (replaced at install)
        self._watch_prev = False
        self._sampled_n = 0         # sampled steps closed (resolution runs every POLL_EVERY of them)
        self._last_index = 0        # the last step whose end this hook saw (the lane's steps skip it)
        self._flushed_at = 0        # rec.resolved when the totals were last written

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
        self.rec = TimelineRecorder(clock, now=getattr(clock, "now", time.perf_counter), opened=self._opened)
        self._thread = threading.get_ident()
        self._ctx = ctx
        self._evals_seen = getattr(ctx, "_eval_passes", 0) or 0
        from diag.probe.perf import sync as perf_sync

        self.copy_watch = perf_sync.COPY_WATCH
        self._listener = self._on_copy
        perf_sync.COPY_LISTENERS.append(self._listener)
        self._patch_saves()

    def uninstall(self, ctx) -> None:
        from diag.probe.hooks import remove_hooks
        from diag.probe.perf import sync as perf_sync

        remove_hooks(self._handles)
        self._handles = []
        if self._listener in perf_sync.COPY_LISTENERS:
            perf_sync.COPY_LISTENERS.remove(self._listener)
        if self._patches is not None:
            self._patches.undo()
            self._patches = None
        self._on = False

    # ---- checkpointing: torch.save (and safetensors' save) marked, never altered ----------------------
    def _patch_saves(self) -> None:
        import importlib
        import importlib.util

        from diag.probe.hooks import Patches

        self._patches = Patches()
        targets = [("torch", "save")]
        try:
            if importlib.util.find_spec("safetensors") is not None:
                targets += [("safetensors.torch", "save_file"), ("safetensors.torch", "save_model")]
        except (ImportError, ValueError):
            pass
        for modname, name in targets:
            try:
                mod = importlib.import_module(modname)
                orig = getattr(mod, name)
            except Exception:
                continue            # safetensors without its torch part, or an older one: not timed
            self._patches.patch(mod, name, self._timed_save(orig))

    def _timed_save(self, orig):
        ext = self

        def save(*args, **kwargs):
            token = ext._ckpt_start()
            try:
                return orig(*args, **kwargs)
            finally:
                if token is not None:
                    ext._ckpt_end(token)

        functools.update_wrapper(save, orig)
        return save

    def _ckpt_start(self):
        """None: not tracked (no CUDA model yet, another thread, a forked child); else whether the
        start was marked (an inner save, safetensors' save_model calling save_file, is not)."""
        rec = self.rec
        if not self._on or rec is None or threading.get_ident() != self._thread or not _sampled(self._ctx) \
                or not self._ctx.is_live():
            return None
        self._ckpt_depth += 1
        if self._ckpt_depth > 1:
            return False
        try:
            return rec.mark("ckpt_start")
        except Exception as e:          # never break the user's save
            self._ctx.report_error("TimelineProbe.checkpoint", e)
            return False

    def _ckpt_end(self, marked: bool) -> None:
        self._ckpt_depth = max(self._ckpt_depth - 1, 0)
        if marked:
            try:
                self.rec.mark("ckpt_end")
            except Exception as e:
                self._ctx.report_error("TimelineProbe.checkpoint", e)

    # ---- hooks -------------------------------------------------------------------------------------
    def _opened(self, st: _PendingStep) -> None:
        """A new pending step (its first mark): did a forward start since the last step ended? (an
        evaluation forward before its first mark: the gap is not idle) Does it follow the last step
        recorded? (not when the steps in between were not sampled and the last of them left no end
        mark: it is then measured from its own first mark)"""
        ctx = self._ctx
        st.gap_forward = getattr(ctx, "forward_start", 0.0) > self._last_end_host > 0
        done = getattr(ctx, "steps_done", None)
        rec = self.rec
        if rec is not None and isinstance(done, int) and rec.prev_index is not None and done != rec.prev_index:
            # the last mark's event is not handed back to the clock (its step may still be pending):
            # it is freed with its step
            st.prev_end = rec._prev_end = None
            rec.prev_index = None

    def on_model(self, ctx, module, info) -> None:
        if not self._on and any(str(d).startswith("cuda") for d in (info.get("devices") or [])):
            self._on = True
            ctx.emit(E.SET, path="timeline.clock", value="device")

    def on_data(self, ctx, edge: str) -> None:
        rec = self.rec
        if not self._on or rec is None or not _sampled(ctx) or not ctx.is_live():
            return
        rec.mark("data_start" if edge == "start" else "data_end")

    def _on_copy(self, edge: str, src=None) -> None:
        # only the training thread's copies (a prefetching thread's would interleave with its marks)
        rec = self.rec
        if not self._on or rec is None or threading.get_ident() != self._thread:
            return
        if edge != "start":
            if self._copy_open:
                self._copy_open = False
                rec.mark("h2d_end")
            return
        if not _sampled(self._ctx):
            return      # a step the probe does not sample: no marks
        same = getattr(rec.clock, "same_stream", None)
        if same is not None and not same():
            return      # a copy on a side stream (a prefetcher's): its events would not be in stream order
        pinned, nbytes = False, 0
        if src is not None:
            try:
                pinned = bool(src.is_pinned())
                nbytes = src.numel() * src.element_size()
            except Exception:
                pass
        self._copy_open = rec.mark("h2d_pinned_start" if pinned else "h2d_start")
        rec.copy(pinned, nbytes)

    def on_optimizer_step(self, ctx, opt) -> None:
        if self._on and self.rec is not None and _sampled(ctx):
            try:
                self.rec.mark("optimizer_start")
            except Exception as e:   # reported; the timeline goes on (a raise would disable it)
                ctx.report_error("TimelineProbe.optimizer", e)

    def on_step_start(self, ctx, index: int) -> None:
        if self._on and self.rec is not None and _sampled(ctx):
            until = None
            n = getattr(ctx, "_eval_passes", None)
            if n is not None and n != self._evals_seen:
                # the step model ended an evaluation pass where this step's training began
                self._evals_seen = n
                until = getattr(ctx, "_last_boundary", None)
            self.rec.begin_step(index, until)

    def on_forward(self, ctx, module, args, kwargs, output, training) -> None:
        if self._on and self.rec is not None and _sampled(ctx):
            self.rec.mark("forward_end")

    def on_step_end(self, ctx, step) -> None:
        rec = self.rec
        if not self._on or rec is None:
            return
        w = self.copy_watch["on"]
        index = step.get("index", 0) or 0
        if self._last_index and index - self._last_index > 1:
            rec.unsampled += index - self._last_index - 1    # unsampled steps the lane closed without this hook
        self._last_index = index
        if step.get("sampled", True) is False:
            # not sampled (the probe's cost budget): nothing recorded. ctx.sampled is the next step's
            # here (the probe decides it before this hook): when it is sampled, one mark at this
            # step's end gives it the gap between the two steps
            self._watch_prev = w
            nxt = _sampled(ctx)
            rec.skip(step.get("index", 0) or 0, nxt)
            if nxt:
                self._last_end_host = rec.now()
            return
        rec.end_step(step.get("index", 0), {"total_s": _r(step.get("total_s")), "data_s": _r(step.get("data_s"))},
                     watched=w and self._watch_prev)
        self._watch_prev = w
        self._last_end_host = rec.now()
        # resolving is a query and an elapsed time per mark and a record per step: done every
        # POLL_EVERY steps, it runs with warm caches after the first record of the batch instead of
        # cold after every step's work (issue 20); the ring holds 64 steps, far more than a batch
        index = step.get("index", 0) or 0
        self._sampled_n += 1
        if index <= 2 or self._sampled_n % POLL_EVERY == 0 or len(rec.ring) >= rec.ring_size - 1 \
                or self._last_end_host - self._last_poll_host >= POLL_MAX_S:
            self._last_poll_host = self._last_end_host
            self._write(ctx, rec.poll())

    def on_exit(self, ctx, status) -> None:
        rec = self.rec
        if rec is None or not self._on:
            return
        done = getattr(ctx, "steps_done", 0) or 0
        if self._last_index and done > self._last_index:
            rec.unsampled += done - self._last_index     # the lane's last steps (unsampled, no hook)
            self._last_index = done
        # one bounded wait at the very end (not the hot path): let the last steps resolve
        deadline = time.perf_counter() + EXIT_WAIT_S
        done = rec.poll()
        while rec.ring and time.perf_counter() < deadline:
            time.sleep(0.005)
            done += rec.poll()
        self._write(ctx, done, force=True)

    def _write(self, ctx, records: list, force: bool = False) -> None:
        for r in records:
            ctx.emit(E.APPEND, path="timeline.steps", value=r, limit=KEEP_STEPS)
        rec = self.rec
        # the totals: with the first steps, then every FLUSH_EVERY resolved steps (sampled steps are
        # not every step: counted, not by index), and at exit
        if force or records and (rec.resolved - self._flushed_at >= FLUSH_EVERY
                                 or any(r["index"] <= 2 for r in records)):
            self._flushed_at = rec.resolved
            ctx.emit(E.MERGE, path="timeline", value=rec.state())


__all__ = ["CudaClock", "Clock", "IDLE_INTERVALS", "INTERVAL_AFTER", "KEEP_STEPS", "RING", "TimelineProbe",
           "TimelineRecorder", "enabled_by_env"]
