"""The Try tab: the knobs the run's findings point to, a button (or ``t``) that runs the trials of
``diag try`` on them, and the table filled as each trial's verdict arrives, then the summary line and
each winner's fix in the words of the run's framework.

The trials run the script again (:class:`diag.tui.models.try_.TrialFeed`, handed over by the command):
in a thread worker, whose callbacks post messages to this pane; escape or ``q`` cancels them (the run
in progress is stopped, with everything it started).
"""
from __future__ import annotations

from rich.console import Group
from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Button, DataTable, Static

from diag.sanitize import for_terminal
from diag.tui.models.try_ import TrialFeed, TryModel
from diag.tui.widgets import Pane, UIState

COLUMNS = ("knob", "speed-up (95% CI)", "step", "samples/s", "peak memory", "verdict", "steps")
VERDICT_STYLES = {"faster": "bold green", "slower": "bold red", "broke": "bold red", "no change": "dim",
                  "unknown": "yellow", "not applicable": "dim", "left out": "dim", "measuring…": "cyan"}


class TrialProgress(Message):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class TrialUpdate(Message):
    def __init__(self, data: dict) -> None:
        super().__init__()
        self.data = data


class TrialsDone(Message):
    def __init__(self, data: dict | None, error: str | None, cancelled: bool) -> None:
        super().__init__()
        self.data = data
        self.error = error
        self.cancelled = cancelled


class TryPane(Pane):
    def __init__(self, feed: TrialFeed | None = None, **kw) -> None:
        super().__init__(**kw)
        self.feed = feed
        self.model = TryModel()
        self._state: UIState | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="try-scroll"):
            yield Static(id="try-head")
            yield Button("Run the trials (t)", id="try-start", variant="primary")
            table = DataTable(id="try-table", cursor_type="none", zebra_stripes=True)
            for col in COLUMNS:
                table.add_column(col, key=col)
            yield table
            yield Static(id="try-foot")

    # ---- state ----------------------------------------------------------------------------------------
    def data_key(self, state: UIState):
        self._state = state
        return (state.version, self.model.version, self._blocked(state))

    @property
    def running(self) -> bool:
        return self.model.status == "running"

    def _blocked(self, state: UIState | None) -> str | None:
        state = state or self._state
        ev = state.evidence if state is not None else None
        status = ev.run.status if ev is not None else None
        src = getattr(self.app, "source", None)
        return self.model.blocked(self.feed, status, bool(src is not None and src.running),
                                  state is not None and state.snapshot is not None)

    # ---- rendering ------------------------------------------------------------------------------------
    def refresh_data(self, state: UIState) -> None:
        self._state = state
        if state.snapshot is not None:
            self.model.plan_from(state.findings)
        m = self.model
        blocked = self._blocked(state)
        self.query_one("#try-head", Static).update(self._head(blocked))
        button = self.query_one("#try-start", Button)
        button.display = self.feed is not None and self.feed.can_run and bool(m.knobs) and m.status != "running"
        button.disabled = blocked is not None
        button.label = "Run the trials again (t)" if m.status in ("done", "cancelled", "failed") else \
            "Run the trials (t)"
        rows = m.rows()
        table = self.query_one("#try-table", DataTable)
        table.display = bool(rows)
        table.clear()
        for r in rows:
            style = VERDICT_STYLES.get(r.verdict, "")
            table.add_row(for_terminal(r.knob), r.speedup, r.step, r.samples, r.memory,
                          Text(r.verdict, style=style), r.steps)
        self.query_one("#try-foot", Static).update(self._foot())

    def _head(self, blocked: str | None) -> Text:
        m = self.model
        t = Text()
        if m.status == "running":
            t.append("● trials running", style="bold cyan")
            t.append(f"   {for_terminal(m.progress)}\n", style="dim")
            t.append("each knob is measured against the baseline as its runs end; escape or q cancels "
                     "(the run in progress is stopped)", style="dim")
            return t
        if not m.knobs and not m.not_applicable and self._state is not None and self._state.snapshot is not None:
            t.append("no knob to try", style="bold")
            t.append(": no finding at warning level or above points to a knob of the catalogue "
                     "(diag try --list shows them; diag try --knob ID measures one anyway)", style="dim")
            return t
        if m.knobs:
            t.append(f"{len(m.knobs)} knob(s) the findings point to: ", style="bold")
            t.append(", ".join(f"{k} ({m.reasons.get(k, '')})" if m.reasons.get(k) else k for k in m.knobs))
            if m.not_applicable:
                t.append("; not applicable from outside: " + ", ".join(k for k, _ in m.not_applicable), style="dim")
            t.append("\n")
        elif m.not_applicable:
            t.append("no knob diag can apply from outside", style="bold")
            t.append(": the findings point only to knobs that need an edit to the script\n", style="dim")
        if m.status == "done":
            t.append("✔ trials done", style="bold green")
        elif m.status == "cancelled":
            t.append("■ trials cancelled: the trials finished before are shown", style="bold yellow")
        elif m.status == "failed":
            t.append(f"✘ the trials could not run: {for_terminal(m.error or '')}", style="bold red")
        elif blocked and blocked != "no knob to try":
            t.append(for_terminal(blocked), style="dim")
        elif not blocked:
            budget = getattr(self.feed, "budget_s", 300.0)
            t.append(f"t (or the button) runs them: the script again under the probe, in a copy of the working "
                     f"directory, with and without each knob, within {budget / 60:.0f} min", style="dim")
        return t

    def _foot(self):
        m = self.model
        parts: list = []
        whys = m.whys()
        if whys:
            w = Text()
            for knob, why in whys:
                w.append(f"  {for_terminal(knob)}: ", style="bold")
                w.append(for_terminal(why) + "\n")
            parts.append(w)
        if m.status in ("done", "cancelled"):
            fx = m.fixes()
            if fx:
                parts.append(Text(f"the fix, in {m.framework_name()}'s words:", style="bold"))
                for spec, fix, snippet in fx:
                    line = Text()
                    line.append(f"  {spec}: ", style="bold green")
                    line.append(for_terminal(fix))
                    parts.append(line)
                    if snippet:
                        parts.append(Syntax(snippet, "python", theme="ansi_dark", background_color="default",
                                            padding=(0, 0, 0, 4)))
            if m.summary:
                s = Text()
                s.append("summary: ", style="bold")
                s.append(for_terminal(m.summary))
                parts.append(s)
            for n in (m.result or {}).get("notes") or []:
                parts.append(Text(f"note: {for_terminal(n)}", style="dim"))
            if m.footer():
                parts.append(Text(for_terminal(m.footer()), style="dim"))
        return Group(*parts) if parts else Text("")

    def _rerender(self) -> None:
        if self._state is not None:
            self.maybe_refresh(self._state)

    # ---- running --------------------------------------------------------------------------------------
    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "try-start":
            event.stop()
            self.start()

    def start(self) -> bool:
        """Start the trials (the ``t`` key and the button); says why not when they cannot start."""
        state = self._state or getattr(self.app, "view", None)
        self._state = state
        if state is not None and state.snapshot is not None:
            self.model.plan_from(state.findings)
        why = self._blocked(state)
        if why is not None:
            self.app.notify(why, timeout=5)
            return False
        self.model.started()
        # the knobs that cannot be applied from outside go too: the result reports them, with why
        specs = list(self.model.knobs) + [k for k, _ in self.model.not_applicable]
        self._run_trials(state.evidence, list(state.findings), specs)
        self._rerender()
        return True

    @work(thread=True, exclusive=True, group="trials")
    def _run_trials(self, evidence, findings, knobs) -> None:
        feed = self.feed
        try:
            data = feed.run(evidence, findings, knobs, progress=lambda s: self.post_message(TrialProgress(s)),
                            update=lambda d: self.post_message(TrialUpdate(d)))
            self.post_message(TrialsDone(data, None, feed.cancelled))
        except KeyboardInterrupt:
            self.post_message(TrialsDone(None, None, True))
        except Exception as e:  # a failure of the trials must not take the UI down: say it in one line
            self.post_message(TrialsDone(None, str(e) or type(e).__name__, feed.cancelled))

    def cancel(self) -> bool:
        if self.feed is None or not self.running:
            return False
        self.feed.cancel()
        self.model.on_progress("cancelling: stopping the run in progress…")
        self._rerender()
        return True

    def on_trial_progress(self, message: TrialProgress) -> None:
        if self.running:
            self.model.on_progress(message.text)
            self._rerender()

    def on_trial_update(self, message: TrialUpdate) -> None:
        if self.running:
            self.model.on_update(message.data)
            self._rerender()

    def on_trials_done(self, message: TrialsDone) -> None:
        self.model.finished(message.data, message.error, message.cancelled)
        self._rerender()
        if message.error:
            self.app.notify(f"the trials could not run: {message.error}", severity="error", timeout=10)
        elif self.model.status == "cancelled":
            self.app.notify("trials cancelled", timeout=4)
        else:
            self.app.notify(f"trials done: {self.model.summary}" if self.model.summary else "trials done",
                            timeout=8, markup=False)
