"""The Try tab's logic, without textual: which knobs the run's findings point to (the trial plan of
:mod:`diag.trial.plan`, pure), the state of the trials, and the table's rows as results arrive.

The trials themselves run the script again under the probe (:mod:`diag.trial.engine`, which needs the
runner): the TUI never imports that. The command that opens the app (``diag tui``) hands it a
:class:`TrialFeed` whose :meth:`TrialFeed.run` runs them; the tab calls it from a thread worker and
shows what its callbacks deliver (a progress line, the result so far as the engine's JSON dict).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from diag.report.try_ import memory_cell as _mem
from diag.report.try_ import ms_cell as _ms
from diag.report.try_ import rate_cell as _rate
from diag.report.try_ import speed_cell as _speed
from diag.trial.plan import from_findings, split

ENDED_BADLY = ("failed", "oom", "killed")


class TrialFeed:
    """What runs the trials, handed over by the command. The base class keeps the bookkeeping (one
    run at a time, cancel, wait for the end); :meth:`_run` does the work. ``can_run`` False (a replay,
    which executes nothing) shows the knobs and ``why_not`` instead of a start button."""

    can_run: bool = True
    why_not: str = ""
    budget_s: float = 300.0

    def __init__(self) -> None:
        self._cancel = threading.Event()
        self._ended = threading.Event()
        self._ended.set()

    @property
    def running(self) -> bool:
        return not self._ended.is_set()

    def run(self, evidence: Any, findings: list, knobs: list[str], *, progress: Callable[[str], None],
            update: Callable[[dict], None]) -> dict:
        """Run the trials of ``knobs`` (specs) on the script of ``evidence`` (blocking; called from a
        worker thread). Returns the result as a dict (the ``diag try --format json`` keys)."""
        if self.running:
            raise RuntimeError("the trials are already running")
        self._cancel.clear()
        self._ended.clear()
        try:
            return self._run(evidence, findings, knobs, progress=progress, update=update, cancel=self._cancel)
        finally:
            self._ended.set()

    def _run(self, evidence, findings, knobs, *, progress, update, cancel: threading.Event) -> dict:
        raise NotImplementedError

    def cancel(self) -> None:
        """Stop the run in progress (the script and everything it started) and start no other."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def wait_ended(self, timeout: float) -> bool:
        return self._ended.wait(timeout)


class ReplayFeed(TrialFeed):
    """A replay executes nothing: the tab lists the knobs and says how to measure them."""

    can_run = False

    def __init__(self, script: str | None = None) -> None:
        super().__init__()
        cmd = f"diag try --script {script}" if script else "diag try --script train.py"
        self.why_not = f"a replay executes nothing; to measure these knobs run `{cmd}` (or diag tui --script)"


@dataclass
class Row:
    knob: str
    speedup: str
    step: str
    samples: str
    memory: str
    verdict: str
    steps: str


@dataclass
class TryModel:
    """The tab's state. ``status``: idle (not started) · running · done · cancelled · failed."""
    status: str = "idle"
    knobs: list[str] = field(default_factory=list)                    # specs the findings point to
    not_applicable: list[tuple[str, str]] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)             # spec -> "finding <id>"
    progress: str = ""                                                # the engine's last progress line
    result: dict | None = None                                        # the result so far (or final)
    error: str | None = None
    version: int = 0                                                  # bumped on every change (re-render)

    # ---- the plan -----------------------------------------------------------------------------------
    def plan_from(self, findings: list) -> None:
        """The knobs the findings point to (at warning or error, their fix a knob of the catalogue).
        Only while idle: a started trial set keeps the plan it started with."""
        if self.status != "idle":
            return
        plan = split(from_findings(findings or []))
        knobs = [p.spec for p in plan.picks]
        na = [(p.spec, why) for p, why in plan.not_applicable]
        if knobs != self.knobs or na != self.not_applicable:
            self.knobs, self.not_applicable = knobs, na
            self.reasons = {p.spec: p.reason for p in plan.picks}
            self.version += 1

    def blocked(self, feed: TrialFeed | None, run_status: str | None, source_running: bool,
                judged: bool) -> str | None:
        """Why the trials cannot start now (one sentence), or None."""
        if feed is None:
            return "no trial runner was given to this app"
        if not feed.can_run:
            return feed.why_not
        if self.status == "running":
            return "the trials are running (escape or q cancels them)"
        if source_running or run_status == "running":
            return "the trials start once the script has finished (s stops it): they run it again, and two " \
                   "runs at once would time each other"
        if not judged:
            return "waiting for the run's findings"
        if run_status in ENDED_BADLY:
            return f"the script did not finish on its own ({run_status}): with no knob it fails already, so " \
                   "there is nothing to try"
        if not self.knobs:
            return "no knob to try"
        return None

    # ---- what the worker delivers -------------------------------------------------------------------
    def started(self) -> None:
        self.status, self.result, self.error, self.progress = "running", None, None, "starting the trials…"
        self.version += 1

    def on_progress(self, text: str) -> None:
        self.progress = text.strip()
        self.version += 1

    def on_update(self, data: dict) -> None:
        self.result = data
        self.version += 1

    def finished(self, data: dict | None, error: str | None = None, cancelled: bool = False) -> None:
        if data is not None:
            self.result = data
        self.error = error
        if error:
            self.status = "failed"
        elif cancelled or (data or {}).get("interrupted"):
            self.status = "cancelled"
        else:
            self.status = "done"
        self.version += 1

    # ---- the table ----------------------------------------------------------------------------------
    def rows(self) -> list[Row]:
        data = self.result or {}
        rows: list[Row] = []
        done = set()
        for t in data.get("trials") or []:
            name = t["knob"] + (" (combined)" if t.get("kind") == "combined" else "")
            rows.append(Row(name, _speed(t), _ms(t.get("step_s")), _rate(t), _mem(t), t.get("verdict") or "",
                            str(t.get("steps") or 0)))
            done.add(t["knob"])
        tried = {n["knob"] for n in data.get("not_tried") or []}
        pending = [k for k in self.knobs if k not in done and k not in tried]
        for k in pending:
            verdict = {"running": "measuring…", "idle": "not run yet"}.get(self.status, "not measured")
            rows.append(Row(k, "-", "-", "-", "-", verdict, "0"))
        for n in data.get("not_tried") or []:
            rows.append(Row(n["knob"], "-", "-", "-", "-", n["verdict"], "0"))
        if not data:
            for k, _why in self.not_applicable:
                rows.append(Row(k, "-", "-", "-", "-", "not applicable", "0"))
        return rows

    def whys(self) -> list[tuple[str, str]]:
        """(knob, what its verdict rests on) for each row that has a reason."""
        data = self.result or {}
        out = [(t["knob"], t["why"]) for t in data.get("trials") or [] if t.get("why")]
        out += [(n["knob"], f"{n['verdict']}: {n['why']}") for n in data.get("not_tried") or []]
        if not data:
            out += [(k, f"not applicable: {why}") for k, why in self.not_applicable]
        return out

    def fixes(self) -> list[tuple[str, str, str | None]]:
        """(knob, the fix in the run's framework's words, snippet) for each knob found faster."""
        if not self.result:
            return []
        from diag.report.try_ import fixes

        return fixes(self.result)

    @property
    def summary(self) -> str:
        return str((self.result or {}).get("summary") or "")

    def framework_name(self) -> str:
        from diag.knobs import FRAMEWORK_NAMES

        fw = (self.result or {}).get("framework")
        return FRAMEWORK_NAMES.get(fw or "torch", "plain PyTorch")

    def footer(self) -> str:
        """The run count and time spent, and where the run directories are."""
        data = self.result or {}
        if not data:
            return ""
        return (f"{len(data.get('runs') or [])} run(s) in {float(data.get('elapsed_s') or 0):.0f} s of a "
                f"{float(data.get('budget_s') or 0):.0f} s budget; run directories under {data.get('directory')}")
