"""Event sinks: where the probe's events go. ``FileSink`` appends one JSON line per event (what
``python -m diag.probe`` uses); ``diag.watch()`` passes a callback instead. Any callable taking one
event dict is a sink."""
from __future__ import annotations

import collections
import json
import os
import threading
import time
from typing import Any

from diag.evidence import events as E

FLUSH_S = 0.2          # step events wait at most this long before they are written
# the writer thread encodes at most CHUNK lines while it holds the GIL, then writes them and sleeps for
# BREATHE_S (a real sleep: the GIL goes to the script's thread, which may be waiting for it since a torch
# op released it). Encoding all of 0.2 s of a short step's lines at once held the GIL until the
# interpreter's 5 ms switch interval forced it off: on a 0.2 ms CPU step the longest steps took 5-8 ms
# under the probe, 0.4-0.6 ms bare. 128 lines (~0.6 ms of encoding) brought them to 1.2-1.9 ms with the
# same mean step; 8 to 32 lines brought most of them under 1 ms but cost 4-8 µs on every step (a GIL
# hand-over per chunk; docs/performance.md, sixteenth pass). Past BACKLOG waiting events the writer stops
# breathing and catches up.
CHUNK = 128
BREATHE_S = 0.0005
BACKLOG = 8192
# the per-step events: the step itself and the extensions' per-step records (``memory.steps``,
# ``timeline.steps``), all handed to the writer thread; and the per-pass ``dataloader`` record (each
# epoch or evaluation pass: written in place it also encoded every waiting step event on the step's
# thread, ~80 µs a step on a loader of 8 batches, issue 28)
DEFERRED = frozenset({E.STEP, E.APPEND, E.DATALOADER})


class FileSink:
    """One JSON object per line.

    Every event but the per-step and per-pass ones (:data:`DEFERRED`: ``step``, the ``append`` of an
    extension's per-step record, a loader's ``dataloader`` record) is written (and reaches the file)
    before the call returns. The per-step events are handed to a writer thread that encodes and writes
    them at most :data:`FLUSH_S` later, :data:`CHUNK` lines at a time with the GIL given back between
    chunks (issue 20: encoding and writing a line on the step's own thread cost ~80 µs of a step, most
    of it cold caches after the step's work; on an H200 the memory and timeline records written in
    place cost more than the step event did); their dicts are never changed after they are emitted.
    Any other event, and
    :meth:`close`, write the waiting step events first, so the file keeps the order of emission. A
    crash that kills the process outright (SIGKILL) loses at most the last 0.2 s of step events, and
    the probe's lane's quiet steps of the last 0.1 s before it (they wait on the step's thread,
    diag.probe.lane.QUIET_NS: those also when the script hangs inside C code and is then killed;
    ``os._exit`` and ``exec`` write them all first). Writes are ``os.write`` on an ``O_APPEND`` descriptor (no Python-level buffer a forked
    child could write a second time); a fork waits for a write in progress to end."""

    def __init__(self, path: str, defer_steps: bool = True):
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._enc = json.JSONEncoder(default=str, allow_nan=False)
        self._defer = defer_steps
        self._pending: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: OSError | None = None    # a write of the writer thread failed (a full disk)
        self._closed = False
        self._pid = os.getpid()
        self.writer_ns = 0                    # CPU time the writer thread spent encoding and writing
        # the step's fast path (issue 28, :meth:`step_path`): True while a deferred event may go straight
        # onto the writer's queue (the writer runs, no error waits to be raised, not closed, not forked)
        self.ready = False
        self.defer = self._pending.append
        try:
            os.register_at_fork(before=self._lock.acquire, after_in_parent=self._lock.release,
                                after_in_child=self._after_fork)
        except Exception:
            pass

    def __call__(self, event: dict) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        if self._closed:
            return
        if self._defer and event.get("kind") in DEFERRED:
            self._pending.append(event)        # deque.append is atomic: no lock on the step's thread
            if self._thread is None:
                self._start()
                self.ready = self._error is None and not self._closed
            return
        with self._lock:
            self._write(self._drain_lines() + [self._line(event)])

    def step_path(self):
        """``(sink, tags)`` for a caller that emits many deferred events (the probe's step events): while
        ``sink.ready`` is True, ``sink.defer(event)`` after ``event.update(tags)`` is what this sink's
        call does with a deferred event, without two Python calls a step (issue 28). None when this
        sink writes every event in place."""
        return (self, {}) if self._defer else None

    def flush(self) -> None:
        """Write the waiting step events now."""
        if os.getpid() != self._pid:
            return
        with self._lock:
            lines = self._drain_lines()
            if lines:
                self._write(lines)

    def close(self) -> None:
        if self._closed:
            return
        self.ready = False
        try:
            self.flush()
        except OSError:
            pass
        self._closed = True
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        try:
            os.close(self._fd)
        except OSError:
            pass

    # ---- internals ------------------------------------------------------------------------------------
    def _line(self, event: Any) -> str:
        if type(event) is tuple:
            # a record to build the event's line (or the event) from, here (the probe's lane:
            # diag.probe.lane.step_line), or a batch of them, their lines (diag.probe.lane.quiet_lines)
            event = event[0](event)
            if type(event) is str:
                return event
            if type(event) is list:
                return "\n".join([x if type(x) is str else self._line(x) for x in event])
        try:
            return self._enc.encode(event)
        except (ValueError, TypeError):   # NaN or infinity (JSON has no spelling for them), odd keys
            return json.dumps(_scrub(event), default=str)

    def _drain_lines(self, limit: int = -1) -> list[str]:
        """The waiting events' lines, in order: all of them, or about ``limit`` lines (a record of many
        steps, diag.probe.lane.quiet_lines, counts as its steps: its builder's ``count``)."""
        out: list[str] = []
        pending = self._pending
        while True:
            try:
                ev = pending.popleft()
            except IndexError:
                return out
            if limit > 0:
                count = getattr(ev[0], "count", None) if type(ev) is tuple else None
                n = 1 if count is None else count(ev)
                if n > limit and out:
                    pending.appendleft(ev)      # (the next chunk's: this one stays near ``limit`` lines)
                    return out
                limit -= n
                out.append(self._line(ev))
                if limit <= 0:
                    return out
            else:
                out.append(self._line(ev))

    def _flush_chunked(self) -> None:
        """The writer thread's flush: :data:`CHUNK` lines at a time, a breath between chunks (the script's
        thread takes the GIL), none once :data:`BACKLOG` events wait. Another event's write (which drains
        everything first, under the lock) may come between two chunks: the file keeps the order."""
        pending = self._pending
        while pending and not self._closed and os.getpid() == self._pid:
            with self._lock:
                lines = self._drain_lines(CHUNK)
                if lines:
                    self._write(lines)
            if pending and len(pending) < BACKLOG:
                time.sleep(BREATHE_S)

    def _write(self, lines: list[str]) -> None:
        data = ("\n".join(lines) + "\n").encode("utf-8")
        while data:
            n = os.write(self._fd, data)
            data = data[n:]

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="diag-probe-sink", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(FLUSH_S)
            if self._closed or os.getpid() != self._pid:
                return
            if not self._pending:
                continue
            t0 = time.thread_time_ns()      # this thread's CPU (not its waits for the GIL or the lock)
            try:
                self._flush_chunked()
            except OSError as e:
                self.ready = False          # the next deferred event takes the call, which raises it
                self._error = e
            except Exception:
                pass
            self.writer_ns += time.thread_time_ns() - t0

    def _after_fork(self) -> None:
        # a forked child (a DataLoader worker) never writes the parent's events
        self._lock.release()
        self._pending = collections.deque()
        self.defer = self._pending.append
        self.ready = False
        self._thread = None
        self._closed = True


def _scrub(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k if isinstance(k, (str, int, float, bool)) or k is None else str(k): _scrub(v)
                for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_scrub(v) for v in obj]
    return obj
