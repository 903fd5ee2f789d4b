"""diag's Textual app: ``diag tui``.

Threads and the UI
------------------
The runner calls back from its own threads (probe events, output lines); the GPU sampler samples in
its own thread. Those callbacks only fill buffers (:mod:`diag.tui.live`, :mod:`diag.tui.models.gpus`).
A timer on the UI thread (every ``tick_s``) looks at the buffers; when there is new evidence it
starts a *thread worker* (at most one at a time, at most every ``refresh_s``) that copies the
evidence and runs every check, and posts the result back as an :class:`Evaluated` message. Renders
are batched per tick (``batch_update``), and only the tab on screen is re-rendered, and only when
the data it shows changed; hidden tabs catch up when they are shown.
"""
from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Callable

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.message import Message
from textual.widgets import Footer, TabbedContent, TabPane

from diag.tui.live import Snapshot, Source
from diag.tui.screens import ConfirmStop, HelpScreen
from diag.tui.widgets import Pane, UIState
from diag.tui.widgets.checks import ChecksPane
from diag.tui.widgets.header import RunHeader
from diag.tui.widgets.log import LogPane
from diag.tui.widgets.steps import StepsPane

TABS_RUN = ("checks", "steps", "gpus", "memory", "cost", "log")
TABS_MONITOR = ("gpus", "cost")
TAB_TITLES = {"checks": "Checks", "steps": "Steps", "gpus": "GPUs", "memory": "Memory", "cost": "Cost",
              "log": "Log", "try": "Try"}

STOP_WAIT_S = 8.0      # quit: how long to wait for the script to end before leaving anyway


class Evaluated(Message):
    """Posted by the evaluation worker (from its thread) with fresh evidence and findings."""

    def __init__(self, snapshot: Snapshot | None, error: str | None = None) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.error = error


class DiagApp(App[int]):
    CSS_PATH = "app.tcss"
    TITLE = "diag"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    ENABLE_COMMAND_PALETTE = False

    BINDINGS = [
        Binding("1", "tab(1)", "tabs", key_display="1-6"),
        Binding("2", "tab(2)", show=False),
        Binding("3", "tab(3)", show=False),
        Binding("4", "tab(4)", show=False),
        Binding("5", "tab(5)", show=False),
        Binding("6", "tab(6)", show=False),
        Binding("7", "tab(7)", show=False),
        Binding("t", "run_trials", show=False),
        Binding("p", "pause", "pause"),
        Binding("s", "stop", "stop script"),
        Binding("w", "save", "save"),
        Binding("question_mark", "help", "keys", key_display="?"),
        Binding("q", "quit", "quit"),
        Binding("escape", "unfocus", show=False),
    ]

    def __init__(self, source: Source | None = None, gpu=None, *, clock: Callable[[], float] = time.time,
                 refresh_s: float = 0.5, tick_s: float = 0.25, initial_tab: str | None = None,
                 cost_defaults: dict | None = None, save_dir: str | None = None, trials=None) -> None:
        super().__init__()
        self.source = source or Source()
        self.gpu = gpu
        self.clock = clock
        self.refresh_s = refresh_s
        self.tick_s = tick_s
        self.mode = self.source.mode
        self.tabs = TABS_MONITOR if self.mode == "monitor" else TABS_RUN
        self.trials = trials                       # a diag.tui.models.try_.TrialFeed: the Try tab (diag try)
        if trials is not None and self.mode != "monitor":
            self.tabs = self.tabs + ("try",)
        self.initial_tab = initial_tab if initial_tab in self.tabs else self.tabs[0]
        self.cost_defaults = cost_defaults or {}
        self.save_dir = save_dir
        self.state = UIState(mode=self.mode, clock=clock, gpu=gpu, source_path=self.source.label,
                             log_path=self.source.log_path)
        self._frozen: UIState | None = None        # what is shown while paused
        self._evaluating = False
        self._last_eval = -1e9
        self._pending_logs: list[tuple[str, str]] = []
        self._announced_end = False
        self._quitting = False
        self.evaluations = 0                       # how many times the checks ran (tests, bench)
        self.first_frame_at: float | None = None

    # ---- layout -------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with TabbedContent(id="tabs", initial=self.initial_tab):
            for i, tab in enumerate(self.tabs, 1):
                with TabPane(f"{i} {TAB_TITLES[tab]}", id=tab):
                    yield self._make_pane(tab)
        yield Footer()

    def _make_pane(self, tab: str) -> Pane:
        if tab == "checks":
            return ChecksPane(id="pane-checks")
        if tab == "steps":
            return StepsPane(id="pane-steps")
        if tab == "log":
            return LogPane(id="pane-log")
        if tab == "gpus":
            from diag.tui.widgets.gpus import GpusPane

            return GpusPane(id="pane-gpus")
        if tab == "memory":
            from diag.tui.widgets.memory import MemoryPane

            return MemoryPane(id="pane-memory")
        if tab == "cost":
            from diag.tui.widgets.cost import CostPane

            return CostPane(defaults=self.cost_defaults, id="pane-cost")
        if tab == "try":
            from diag.tui.widgets.try_ import TryPane

            return TryPane(self.trials, id="pane-try")
        raise ValueError(tab)

    def get_key_display(self, binding: Binding) -> str:
        if binding.action.startswith("tab("):
            return f"1-{len(self.tabs)}"
        return super().get_key_display(binding)

    # ---- lifecycle ----------------------------------------------------------------------------------
    def on_mount(self) -> None:
        self.query_one(RunHeader).show(self.view)
        try:
            self.source.start()
        except Exception as e:  # the command validated everything it could; say what went wrong
            self.notify(f"cannot start the script: {e}", severity="error", timeout=30)
        if self.gpu is not None:
            self.gpu.start()
        self.set_interval(self.tick_s, self._tick)
        self.call_after_refresh(self._first_frame)
        self._tick()

    def _first_frame(self) -> None:
        if self.first_frame_at is None:
            self.first_frame_at = time.perf_counter()

    def on_unmount(self) -> None:
        if self.gpu is not None:
            self.gpu.stop()

    @property
    def view(self) -> UIState:
        return self._frozen if self._frozen is not None else self.state

    @property
    def active_tab(self) -> str:
        return self.query_one("#tabs", TabbedContent).active

    def pane(self, tab: str) -> Pane:
        return self.query_one(f"#pane-{tab}", Pane)

    # ---- the tick: batch what arrived, render what is on screen --------------------------------------
    def _tick(self) -> None:
        now = time.monotonic()
        interval = self.source.min_interval(self.refresh_s)
        if not self._evaluating and now - self._last_eval >= interval and self.source.pending():
            self._evaluating = True
            self._last_eval = now
            self._evaluate()
        if self.gpu is not None and self.gpu.poll():
            self.state.gpu_version += 1
        logs = self.source.take_logs()
        if logs:
            self._pending_logs.extend(logs)
            if len(self._pending_logs) > 2 * 20000:
                drop = len(self._pending_logs) - 20000
                del self._pending_logs[:drop]
                self.state.extra["log_dropped"] = self.state.extra.get("log_dropped", 0) + drop
        dropped = getattr(self.source, "dropped_lines", 0)
        if dropped:
            self.state.extra["log_dropped"] = max(self.state.extra.get("log_dropped", 0), dropped)
        self._render()

    def _render(self) -> None:
        try:
            self._render_now()
        except NoMatches:       # the app is closing: its widgets are gone
            pass

    def _render_now(self) -> None:
        view = self.view
        with self.batch_update():
            self.query_one(RunHeader).show(dataclasses.replace(view, paused=self.state.paused,
                                                               stopping=self.state.stopping))
            tab = self.active_tab
            if tab:
                self.pane(tab).maybe_refresh(view)
                if tab == "log" and not self.state.paused and self._pending_logs:
                    lines, self._pending_logs = self._pending_logs, []
                    self.pane("log").write_lines(lines)

    @work(thread=True, exclusive=True, group="evaluate")
    def _evaluate(self) -> None:
        try:
            snap = self.source.evaluate()
            self.post_message(Evaluated(snap))
        except Exception as e:  # a broken evidence copy must not take the UI down
            self.post_message(Evaluated(None, f"{type(e).__name__}: {e}"))

    def on_evaluated(self, message: Evaluated) -> None:
        self._evaluating = False
        self.evaluations += 1
        if message.error:
            self.notify(f"could not judge the evidence: {message.error}", severity="error")
            return
        snap = message.snapshot
        if snap is None:
            return
        self.state.version += 1
        snap.version = self.state.version
        self.state.snapshot = snap
        status = snap.evidence.run.status
        if snap.final or status != "running":
            self.state.stopping = False
            if not self._announced_end and self.mode == "run":
                self._announced_end = True
                self._announce_end(snap)
            self.refresh_bindings()
        self._render()

    def _announce_end(self, snap: Snapshot) -> None:
        run = snap.evidence.run
        text = {
            "completed": ("the script completed", "information"),
            "stopped": (f"the script was stopped{': ' + run.stop_reason if run.stop_reason else ''}",
                        "information"),
            "timeout": (f"the script was stopped: {run.stop_reason or 'time limit'}", "information"),
            "failed": ("the script CRASHED — see the header, the Log tab and the findings", "error"),
            "oom": ("the script ran OUT OF MEMORY — see the Memory tab and the findings", "error"),
            "killed": (f"the script was killed{': ' + run.stop_reason if run.stop_reason else ''}",
                       "error"),
        }.get(run.status, (f"the script ended ({run.status})", "warning"))
        self.notify(text[0] + "; the findings stay here to browse", severity=text[1], timeout=8)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        self._render()

    # ---- actions ------------------------------------------------------------------------------------
    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action == "stop":
            if self.mode != "run":
                return False
            return True if self.source.running and not self.state.stopping else None
        if action == "save":
            return self.mode != "monitor"
        if action == "tab" and parameters:
            return int(parameters[0]) <= len(self.tabs)
        return True

    def action_tab(self, n: int) -> None:
        if 1 <= n <= len(self.tabs):
            self.query_one("#tabs", TabbedContent).active = self.tabs[n - 1]

    def action_pause(self) -> None:
        if self.state.paused:
            self.state.paused = False
            self._frozen = None
            self.notify("updates resumed", timeout=2)
        else:
            self._frozen = dataclasses.replace(self.state, extra=dict(self.state.extra))
            self.state.paused = True
            self.notify("updates paused: the script keeps running, nothing is lost; p resumes",
                        timeout=3)
        self._render()

    def action_stop(self) -> None:
        if not self.source.running:
            self.notify("the script is not running", timeout=3)
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self.stop_script("stopped from diag tui")

        self.push_screen(ConfirmStop(), answered)

    def stop_script(self, reason: str) -> None:
        if self.source.running:
            self.state.stopping = True
            self.source.stop(reason)
            self.notify("stopping the script (SIGTERM, then SIGKILL after 5 s)…", timeout=4)
            self.refresh_bindings()
            self._render()

    def action_save(self) -> None:
        try:
            paths = self.save()
        except OSError as e:
            self.notify(f"could not save: {e}", severity="error")
            return
        if paths:
            from diag.tui.fmt import saved_message

            # the toast is at most 60 cells and half the screen wide, less its padding and border
            width = max(20, min(60, self.size.width // 2) - 6)
            self.notify(saved_message(paths, os.getcwd(), width), timeout=8, markup=False)
        else:
            self.notify("nothing to save yet", timeout=3)

    def save(self) -> list[Path]:
        """Write evidence.json, report.json and report.txt; returns the paths written."""
        snap = self.state.snapshot
        if snap is None:
            return []
        from diag.tui.save import save_report

        run = getattr(self.source, "run", None)
        return save_report(snap.evidence, snap.findings, run=run, save_dir=self.save_dir,
                           replay=self.mode == "replay")

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_unfocus(self) -> None:
        if self.active_tab == "try" and self._try_pane() is not None and self._try_pane().cancel():
            return
        self.set_focus(None)

    def _try_pane(self):
        if "try" not in self.tabs:
            return None
        try:
            return self.pane("try")
        except NoMatches:
            return None

    def action_run_trials(self) -> None:
        pane = self._try_pane()
        if pane is None:
            return
        self.query_one("#tabs", TabbedContent).active = "try"
        if not pane.running:
            pane.start()

    async def action_quit(self) -> None:
        pane = self._try_pane()
        if pane is not None and pane.running and not self._quitting:
            self._quitting = True                  # a second q leaves at once (the command still waits)
            pane.cancel()
            self.notify("cancelling the trials: the run in progress is stopped…", timeout=4)
            self._wait_trials_then_exit()
            return
        if self._quitting or not self.source.running:
            self.exit(0)
            return
        self._quitting = True
        self.stop_script("stopped: diag tui was closed")
        self._wait_then_exit()

    @work(thread=True, group="quit")
    def _wait_trials_then_exit(self) -> None:
        self.trials.wait_ended(STOP_WAIT_S + 10)
        self.call_from_thread(self.exit, 0)

    @work(thread=True, group="quit")
    def _wait_then_exit(self) -> None:
        wait = getattr(self.source, "wait_ended", None)
        if wait is not None:
            wait(STOP_WAIT_S)
        self.call_from_thread(self.exit, 0)
