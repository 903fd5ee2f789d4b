"""The TUI's data plumbing, without textual: what the background threads deliver, batched for the UI.

The runner calls :class:`RunFeed`'s callbacks from its own threads (one per probe event, one per
output line). They only append to buffers and raise a flag, under a lock: nothing here touches the
UI. The app's timer asks :meth:`RunFeed.pending` whether there is something new and, at most every
``refresh_s``, re-evaluates the checks in a thread worker (:meth:`RunFeed.evaluate`).

A :class:`Source` is what the app shows: a live run, a saved evidence file (replay), or nothing (the
GPU monitor).
"""
from __future__ import annotations

import collections
import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from diag.evidence import Evidence
from diag.findings import Finding, sort_findings

LOG_LINES_KEPT = 20000   # lines the Log tab holds; log.txt in the run directory keeps every line
MAX_EVAL_SHARE = 0.2     # re-judging may use at most this share of the time (slows down on huge evidence)


def _copy_section(value):
    """Dicts copied all the way down; lists copied (their records are never changed once appended)."""
    if isinstance(value, dict):
        return {k: _copy_section(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy_section(v) if isinstance(v, dict) else v for v in value]
    return value


def copy_evidence(ev: Evidence) -> Evidence:
    """A consistent copy of live evidence, made under the runner's lock, ~100x cheaper than the
    JSON round trip of ``Run.snapshot()`` on long runs (2000 steps: ~2 ms instead of ~200 ms).

    It relies on how :mod:`diag.fold` builds Evidence: step, exception, model, data-loader and
    optimizer records are appended or replaced, never changed in place (forward sites are: their
    counts; they are copied); rank sections are nested dicts changed in place (copied); ``gpu`` and
    ``environment`` are replaced wholesale. Checks are pure functions: they do not change what they read.
    """
    new = copy.copy(ev)
    new.run = copy.copy(ev.run)
    new.run.args = list(ev.run.args)
    new.run.command = list(ev.run.command)
    new.run.limits = dict(ev.run.limits)
    new.run.sources = list(ev.run.sources)
    new.notes = list(ev.notes)
    new.memory_plan = _copy_section(ev.memory_plan)
    ranks = []
    for r in ev.ranks:
        c = copy.copy(r)
        c.steps = list(r.steps)
        c.step_stats = copy.copy(r.step_stats)
        c.dataloaders = list(r.dataloaders)
        c.models = list(r.models)
        c.forwards = [copy.copy(f) for f in r.forwards]
        c.optimizers = list(r.optimizers)
        c.exceptions = list(r.exceptions)
        for name in ("memory", "flops", "amp", "sync", "distributed", "extras"):
            setattr(c, name, _copy_section(getattr(r, name)))
        ranks.append(c)
    new.ranks = ranks
    return new


Checker = Callable[[Evidence], list[Finding]]


def default_checker() -> Checker:
    """Every installed check (built-ins and plugins), as ``diag check`` runs them."""
    from diag.registry import Registry

    registry = Registry.discover()
    return registry.run


@dataclass
class Snapshot:
    """What the UI renders: one consistent copy of the evidence and the findings judged on it."""
    evidence: Evidence
    findings: list[Finding]
    version: int = 0
    evaluated_at: float = 0.0          # clock time of the evaluation
    final: bool = False                # the run has ended: nothing will change any more


@dataclass
class LogBuffer:
    """Output lines waiting to be shown, and a count of those that could not be kept."""
    lines: collections.deque = field(default_factory=lambda: collections.deque(maxlen=LOG_LINES_KEPT))
    dropped: int = 0


class Source:
    """Base: nothing runs (used as is for the GPU monitor mode)."""
    mode = "monitor"
    run = None
    path: str | None = None
    label: str | None = None

    def start(self) -> None:
        pass

    @property
    def running(self) -> bool:
        return False

    def pending(self) -> bool:
        """Is there evidence the UI has not seen yet?"""
        return False

    def evaluate(self) -> Snapshot | None:
        return None

    def min_interval(self, refresh_s: float) -> float:
        return refresh_s

    def take_logs(self) -> list[tuple[str, str]]:
        return []

    def stop(self, reason: str) -> None:
        pass

    @property
    def log_path(self) -> str | None:
        return None


class ReplaySource(Source):
    """A saved evidence file: judged once, nothing is executed."""
    mode = "replay"

    def __init__(self, evidence: Evidence, checker: Checker | None = None, path: str | None = None,
                 findings: list[Finding] | None = None, label: str | None = None):
        self.evidence = evidence
        self.checker = checker
        self.path = path
        self.label = label or path       # how the header names the file
        self._findings = findings
        self._done = False
        self._logs_read = False

    def pending(self) -> bool:
        return not self._done

    def evaluate(self) -> Snapshot:
        findings = self._findings
        if findings is None:
            findings = (self.checker or default_checker())(self.evidence)
        self._done = True
        return Snapshot(self.evidence, sort_findings(findings), final=True)

    @property
    def log_path(self) -> str | None:
        """The saved run's log.txt: where the evidence says, else beside the evidence file (a run
        directory copied elsewhere)."""
        import os

        cands = [self.evidence.run.log_path]
        if self.path:
            base = self.path if os.path.isdir(self.path) else os.path.dirname(self.path)
            cands.append(os.path.join(base, "log.txt"))
        for c in cands:
            if c and os.path.isfile(c):
                return c
        return self.evidence.run.log_path

    def take_logs(self) -> list[tuple[str, str]]:
        """The saved run's log (read once)."""
        if self._logs_read:
            return []
        self._logs_read = True
        path = self.log_path
        if not path:
            return []
        from diag.logtext import shown_line

        try:
            with open(path, encoding="utf-8", errors="replace", newline="") as f:
                lines = f.read().split("\n")
        except OSError:
            return []
        if lines and lines[-1] == "":
            lines.pop()
        # as the Log tab showed it live: a line redrawn with carriage returns is its last redraw
        return [("stdout", shown_line(line) + "\n") for line in lines[-LOG_LINES_KEPT:]]


class RunFeed(Source):
    """A live :class:`diag.runner.Run`: callbacks from the runner's threads, batched for the UI."""
    mode = "run"

    def __init__(self, run, checker: Checker | None = None, clock: Callable[[], float] = time.time):
        self.run = run
        self.checker = checker
        self.clock = clock
        self._lock = threading.Lock()
        self._dirty = True                # evaluate once at start (the header needs the run info)
        self._ended = False
        self._final_sent = False
        self._events = 0
        self._logs = LogBuffer()
        self.last_eval_s = 0.0
        run.listeners.append(self._on_event)
        run.log_listeners.append(self._on_log)

    # ---- called from the runner's threads: cheap, never raises, never touches the UI --------------
    def _on_event(self, event: dict) -> None:
        with self._lock:
            self._events += 1
            self._dirty = True
            if event.get("kind") == "run_end":
                self._ended = True

    def _on_log(self, stream: str, line: str) -> None:
        with self._lock:
            buf = self._logs
            if len(buf.lines) == buf.lines.maxlen:
                buf.dropped += 1
            buf.lines.append((stream, line))

    # ---- called by the app ------------------------------------------------------------------------
    def start(self) -> None:
        if self.run.proc is None:
            self.run.start()

    @property
    def running(self) -> bool:
        return self.run.proc is not None and self.run.running

    @property
    def events(self) -> int:
        return self._events

    def pending(self) -> bool:
        with self._lock:
            return self._dirty or (self._ended and not self._final_sent)

    def take_logs(self) -> list[tuple[str, str]]:
        with self._lock:
            out = list(self._logs.lines)
            self._logs.lines.clear()
        return out

    @property
    def dropped_lines(self) -> int:
        return self._logs.dropped

    def evaluate(self) -> Snapshot:
        """Copy the evidence so far and run every check on it (called in a thread worker)."""
        with self._lock:
            self._dirty = False
            final = self._ended
        t0 = time.perf_counter()
        with self.run.lock:
            evidence = copy_evidence(self.run.evidence)
        checker = self.checker
        if checker is None:
            checker = self.checker = default_checker()
        findings = sort_findings(checker(evidence))
        if final:
            self._final_sent = True
        self.last_eval_s = time.perf_counter() - t0
        return Snapshot(evidence, findings, evaluated_at=self.clock(), final=final)

    def min_interval(self, refresh_s: float) -> float:
        """The time to wait before the next re-judging: ``refresh_s``, longer when judging is slow."""
        return max(refresh_s, self.last_eval_s / MAX_EVAL_SHARE)

    def stop(self, reason: str = "stopped from diag tui") -> None:
        if self.running:
            self.run.stop(reason, "stopped")

    def wait_ended(self, timeout: float) -> bool:
        """Wait (in a worker) until the script and its descendants are gone."""
        deadline = time.monotonic() + timeout
        while self.run.proc is not None and self.run.running and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.running

    @property
    def log_path(self) -> str | None:
        return str(self.run.log_path)
