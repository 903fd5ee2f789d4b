"""Training in child processes (Hogwild with ``torch.multiprocessing``, ``multiprocessing.Process``
workers that train, ``torch.multiprocessing.spawn``): the probe follows the children.

The parent patches ``multiprocessing.process.BaseProcess.start``: a process whose ``target`` is the
user's code (not torch's own DataLoader workers) gets its target wrapped in :class:`ChildTarget`, a
picklable callable, so the wrapper reaches the child under every start method:

- **fork**: the child inherits the parent's probe (silenced after the fork, as DataLoader workers
  are); the wrapper turns it back on in child mode: fresh step state, no extensions, and a sink
  that only counts;
- **spawn / forkserver**: unpickling the wrapper imports this module in the fresh interpreter, and
  the wrapper installs a counting probe before the target runs.

When the target returns (or raises), the child appends one ``child`` event to the parent's events
file (``DIAG_EVENTS``, inherited through the environment; one ``write`` of one line on a file opened
for appending): its pid, start method, steps, training forwards, samples and step times. Diag folds
them into ``RankEvidence.children``; run.no-steps reports training that ran only in children as
such, never as "no training".
"""
from __future__ import annotations

import json
import os
import statistics
import time
from diag.evidence import events as E

_PARENT = None       # the probe of this process, when it is diag's (set by install)


def install(probe) -> None:
    """Wrap user targets of processes started from now on (undone by the probe's patches)."""
    global _PARENT
    _PARENT = probe
    try:
        from multiprocessing import process
    except Exception:
        return
    orig_start = process.BaseProcess.start

    def start(self):
        try:
            _wrap_target(self)
        except Exception as e:
            probe.report_error("multiprocessing.start", e)
        return orig_start(self)

    start.__wrapped__ = orig_start
    probe.patch(process.BaseProcess, "start", start)


def _wrap_target(proc) -> None:
    target = getattr(proc, "_target", None)
    if target is None or isinstance(target, ChildTarget) or not _PARENT or not _PARENT.active:
        return
    mod = getattr(target, "__module__", "") or ""
    # torch's own processes (DataLoader workers) are not training; torch.multiprocessing.spawn's
    # wrapper runs the user's function
    if mod.startswith(("torch.", "multiprocessing.", "concurrent.")) and mod != "torch.multiprocessing.spawn":
        return
    try:
        method = proc._start_method or None
    except Exception:
        method = None
    if method is None:
        try:
            import multiprocessing

            method = multiprocessing.get_start_method(allow_none=True) or "fork"
        except Exception:
            method = None
    events = getattr(_PARENT.sink, "path", None) or os.environ.get("DIAG_EVENTS")
    if not events:
        return
    proc._target = ChildTarget(target, events, _PARENT.rank, method, type(_PARENT))


class ChildTarget:
    """The user's process target, run under a counting probe; picklable (spawn)."""

    def __init__(self, target, events: str, rank: int, start_method: str | None, probe_cls=None):
        self.target = target
        self.events = events
        self.rank = rank
        self.start_method = start_method
        self.probe_cls = probe_cls   # the parent's probe class (pickled by name: a spawned child imports it)

    def __call__(self, *args, **kwargs):
        counter = _StepCounter()
        probe = None
        try:
            probe = _child_probe(counter, self.rank, self.probe_cls)
        except Exception:
            probe = None
        status = "completed"
        try:
            return self.target(*args, **kwargs)
        except BaseException:
            status = "failed"
            raise
        finally:
            if probe is not None:
                try:
                    _finish_child(probe)
                except BaseException:
                    pass
            counter.write(self.events, self.rank, self.start_method, status)


class _StepCounter:
    """A sink that keeps only what the child's summary needs."""

    def __init__(self):
        self.steps = 0
        self.forwards = 0
        self.samples = 0
        self.totals: list[float] = []
        self.first_start: float | None = None
        self.last_end: float | None = None

    def __call__(self, event: dict) -> None:
        if event.get("kind") != E.STEP:
            return
        self.steps += 1
        self.forwards += int(event.get("n_forward") or 0)
        self.samples += int(event.get("samples") or 0)
        total = float(event.get("total_s") or 0.0)
        end = float(event.get("t") or 0.0)
        if len(self.totals) < 10000:
            self.totals.append(total)
        if self.first_start is None:
            self.first_start = end - total
        self.last_end = end

    def write(self, path: str, rank: int, start_method: str | None, status: str) -> None:
        if not self.steps and not self.forwards:
            return     # a helper process that did not train: nothing to say
        ev = {"kind": E.CHILD, "t": None, "rank": rank, "pid": os.getpid(), "start_method": start_method,
              "run": os.environ.get("DIAG_RUN_ID"),    # the run marker the runner reads events by
              "steps": self.steps, "forwards": self.forwards, "samples": self.samples,
              "time_s": round((self.last_end or 0.0) - (self.first_start or 0.0), 6),
              "median_step_s": round(statistics.median(self.totals), 6) if self.totals else None,
              "status": status}
        line = (json.dumps(ev, default=str) + "\n").encode("utf-8")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)    # one write of one line: appends never interleave inside it
            finally:
                os.close(fd)
        except OSError:
            pass


def _child_probe(counter: _StepCounter, rank: int, probe_cls=None):
    """The probe of this child: the inherited one (fork), back on in child mode, or a new one of the
    parent's class."""
    inherited = _PARENT
    if inherited is not None and inherited.pid != os.getpid():
        inherited.become_child(counter)
        return inherited
    if probe_cls is None:
        return None
    probe = probe_cls(counter, rank=rank, extensions=[], script=None)
    probe.child = True
    probe.install()
    return probe


def _finish_child(probe) -> None:
    lane_off = getattr(probe, "lane_off", None)
    if lane_off is not None:
        lane_off()
    probe.steps.close_open_step(time.perf_counter())
    probe.silence()     # nothing more from this child
