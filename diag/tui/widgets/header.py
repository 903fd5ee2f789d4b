"""The run header: what runs, its status (running, completed, crashed, OOM ...), time, step, the
findings' counts, and the badges (PAUSED, SIMULATED GPUs, replay)."""
from __future__ import annotations

import os

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from diag.evidence import probe as probe_cost
from diag.findings import Severity, count_phrase
from diag.report.style import SEVERITY_STYLES
from diag.redact import redact_args
from diag.sanitize import for_terminal as safe
from diag.tui import fmt
from diag.tui.models.steps import summarize_attach
from diag.tui.widgets import UIState

STATUS = {
    # status: (symbol, label, style, css class)
    "running": ("●", "running", "bold yellow", "-running"),
    "completed": ("✔", "completed", "bold green", "-ok"),
    "stopped": ("■", "stopped", "bold green", "-ok"),
    "timeout": ("■", "time limit reached", "bold yellow", "-ok"),
    "interrupted": ("■", "interrupted", "bold yellow", "-warn"),
    "failed": ("✘", "CRASHED", "bold red", "-failed"),
    "oom": ("✘", "OUT OF MEMORY", "bold red", "-failed"),
    "killed": ("✘", "KILLED", "bold red", "-failed"),
}

COUNTED = (Severity.CRASHED, Severity.ERROR, Severity.WARNING)    # the problems the header counts


def status_class(state: UIState) -> str:
    ev = state.evidence
    if state.mode == "monitor" or ev is None:
        return "-running" if state.mode == "run" else "-idle"
    return STATUS.get(ev.run.status, ("", "", "", "-warn"))[3]


def header_lines(state: UIState) -> tuple[Text, Text]:
    """(line 1, line 2) of the header."""
    one = Text(no_wrap=True, overflow="ellipsis")
    two = Text(no_wrap=True, overflow="ellipsis")
    one.append(" diag ", style="bold reverse")
    one.append(" ")
    if state.mode == "monitor":
        one.append("GPU monitor and cost calculator", style="bold")
        one.append(" · no script runs (diag tui --script train.py runs one)", style="dim")
        _badges(state, two)
        return one, two
    ev = state.evidence
    if ev is None:
        one.append("starting the script under the probe…", style="yellow")
        _badges(state, two)
        return one, two
    run = ev.run
    status = run.status
    if state.stopping and status == "running":
        sym, label, style = "●", "stopping…", "bold yellow"
    else:
        sym, label, style, _ = STATUS.get(status, ("?", safe(status), "bold", ""))
    one.append(f"{sym} {label}", style=style)
    if status not in ("running",) and run.exit_code not in (None, 0):
        one.append(f" (exit {run.exit_code})", style=style)
    one.append("  ")
    script = os.path.basename(run.script) if run.script else run.id or "run"
    one.append(safe(script), style="bold")
    if run.args:
        one.append(" " + safe(" ".join(str(a) for a in redact_args(run.args))), style="dim")
    attached = getattr(run, "source", "probe") == "attach"
    # elapsed
    if attached:
        elapsed = None                 # wall_s is the sampling window, said above
    elif run.wall_s is not None and status != "running":
        elapsed = run.wall_s
    elif run.started_at:
        elapsed = max(0.0, state.clock() - run.started_at)
    else:
        elapsed = None
    if elapsed is not None:
        one.append(f" · {fmt.duration(elapsed)}")
    if attached:
        if len(ev.ranks) > 1:
            one.append(f" · {len(ev.ranks)} ranks")
    elif ev.ranks:
        steps = ev.primary.step_stats.count
        last = ev.primary.steps[-1] if ev.primary.steps else None
        if not steps and ev.primary.eval_stats.count:
            # an evaluation run (so far): its evaluation steps, not "step 0"
            one.append(f" · evaluation step {ev.primary.eval_stats.count}")
        else:
            one.append(f" · step {last.index if last else steps}")
        if last is not None and last.epoch is not None:
            one.append(f" · epoch {last.epoch}")
        if len(ev.ranks) > 1:
            one.append(f" · {len(ev.ranks)} ranks")
    counts = {s: 0 for s in Severity}
    for f in state.findings:
        counts[f.severity] += 1
    shown = [(s, n) for s, n in counts.items() if n and s in COUNTED]
    if shown:
        one.append(" ·  ")
        for i, (s, n) in enumerate(sorted(shown, key=lambda x: -x[0].rank)):
            st = SEVERITY_STYLES[s].style
            one.append(count_phrase(s, n), style=st)
            if i < len(shown) - 1:
                one.append(" ")
    elif state.snapshot is not None:
        one.append(" · no problems found so far" if status == "running" else " · no problems found",
                   style="green")
    # line two: why it ended, where things are, badges
    _badges(state, two)              # first: "simulated" must always be seen
    if attached:
        _attached(ev, two)           # next: which process, which window (no steps: sampled)
    reason = _end_reason(ev)
    if reason:
        two.append(safe(reason), style="red" if status in ("failed", "oom", "killed") else "")
        two.append("  ")
    own = probe_cost.of_evidence(ev)
    if own:
        two.append(f"diag's probe ≥{probe_cost.pct(own['median_step_share'])} of the median step",
                   style="yellow" if own["median_step_share"] > probe_cost.WARN_SHARE else "dim")
        two.append("  ")
    samp = probe_cost.sampling_summary(ev.primary) if ev.ranks else None
    if samp:        # the probe's cost budget: its per-step extras on sampled steps only
        two.append(f"timeline & memory on {probe_cost.sampling_rate_words(samp)}", style="dim")
        two.append("  ")
    if state.mode == "replay":
        two.append("replay of ", style="dim")
        two.append(safe(state.source_path or "saved evidence"), style="dim")
        two.append(" (nothing executed)", style="dim")
    elif run.run_dir:
        two.append("run dir ", style="dim")
        two.append(safe(_home(fmt.short_path(run.run_dir, os.getcwd()))), style="dim")
    return one, two


def _attached(ev, t: Text) -> None:
    """diag attach / diag tui --attach: which process was sampled, and the window (no steps: sampling
    records none)."""
    a = summarize_attach(ev)
    pids = a.pids if a else []
    t.append(" ATTACHED ", style="bold black on cyan")
    if a and a.job_pid is not None:
        t.append(f" to job PID {a.job_pid}")
    elif pids:
        t.append(f" to PID {pids[0]}" if len(pids) == 1 else f" to PIDs {', '.join(map(str, pids[:4]))}")
    if a and a.window_s:
        t.append(f" · sampled window {a.window_s:.1f} s" + (f" at {a.rate_hz:g} Hz" if a.rate_hz else ""))
    t.append("  ")


def _home(path: str) -> str:
    home = os.path.expanduser("~")
    if home and home != "/" and path.startswith(home + "/"):
        return "~" + path[len(home):]
    return path


def _end_reason(ev) -> str:
    run = ev.run
    if run.status in ("failed", "oom"):
        for r in ev.ranks:
            if r.exceptions:
                e = r.exceptions[-1]
                msg = e.message.strip().splitlines()[0] if e.message.strip() else ""
                where = ""
                if e.location:
                    where = f" at {os.path.basename(str(e.location.get('file', '')))}:{e.location.get('line')}"
                return fmt.shorten(f"{e.type}: {msg}{where}", 120)
    if run.stop_reason:
        return run.stop_reason
    return ""


def _badges(state: UIState, t: Text) -> None:
    if state.paused:
        t.append(" PAUSED ", style="bold black on yellow")
        t.append(" updates held, the script keeps running; p resumes ", style="yellow")
        t.append(" ")
    gpu = state.gpu
    sim = getattr(gpu, "simulated", None) if gpu is not None else None
    if not sim and state.evidence is not None:
        sim = state.evidence.run.simulated_gpus
    if sim:
        t.append(f" SIMULATED GPUs ({sim}) ", style="bold white on magenta")
        t.append(" ")


class RunHeader(Vertical):
    """Two lines at the top of the screen (each cut with an ellipsis, never wrapped)."""

    DEFAULT_CSS = """
    RunHeader { dock: top; height: 2; }
    RunHeader > Static { height: 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._last: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="header-1")
        yield Static(id="header-2")

    def show(self, state: UIState) -> None:
        one, two = header_lines(state)
        key = (one.markup, two.markup, status_class(state))
        if key == self._last:          # nothing changed: no re-render
            return
        self._last = key
        self.query_one("#header-1", Static).update(one)
        self.query_one("#header-2", Static).update(two)
        for cls in ("-running", "-ok", "-warn", "-failed", "-idle"):
            self.set_class(cls == status_class(state), cls)

    @property
    def text(self) -> str:
        """The header as plain text (tests)."""
        one, two = (self.query_one(f"#header-{i}", Static) for i in (1, 2))
        return f"{one.render()}\n{two.render()}"
