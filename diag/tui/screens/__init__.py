"""Modal screens of diag's TUI: the key help and the stop confirmation."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = [
    ("1 … 7", "switch tab: Checks, Steps, GPUs, Memory, Cost, Log, Try (GPU monitor: 1 GPUs, 2 Cost)"),
    ("t", "Try tab: run diag try's trials on the knobs the findings point to (escape cancels them)"),
    ("p", "pause / resume updates (the script keeps running; nothing is lost)"),
    ("s", "stop the script (asks first); its findings stay browsable"),
    ("w", "save: evidence.json, report.json and report.txt in the run directory"),
    ("q", "quit: stops the script (or the trials) and its descendants, prints where the run directory is"),
    ("?", "this help"),
    ("↑ ↓ / PgUp PgDn", "move in the findings list, scroll the detail and the log"),
    ("tab / shift+tab", "move the focus (findings list, detail, cost form)"),
    ("escape", "leave a form field / close this help"),
]


def keys_table() -> Table:
    t = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
    t.add_column(style="bold cyan", no_wrap=True)
    t.add_column()
    for k, v in KEYS:
        t.add_row(k, v)
    return t


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss_help", "close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box"):
            yield Static(Text("diag tui — keys", style="bold"), id="help-title")
            with VerticalScroll():
                yield Static(keys_table())
                yield Static(Text(
                    "\nChecks: findings, most severe first, re-judged as evidence arrives.\n"
                    "Steps: where a step's time goes, throughput, step-time history, per-rank rows.\n"
                    "GPUs: one pane per device (utilisation, memory, temperature, power, clocks,\n"
                    "throttling, processes); host CPU and RAM.\n"
                    "Memory: parameters / gradients / optimizer / activations, OOM diagnosis,\n"
                    "batch-size plan.\n"
                    "Cost: what a full training or evaluation run costs; edit the form.\n"
                    "Log: the script's stdout and stderr (also in the run directory's log.txt).",
                    style="dim"))
            yield Static(Text("escape closes", style="dim"), id="help-foot")

    def action_dismiss_help(self) -> None:
        self.dismiss(None)


class ConfirmStop(ModalScreen[bool]):
    BINDINGS = [Binding("y,s,enter", "answer(True)", "stop it"),
                Binding("n,escape,q", "answer(False)", "keep it running")]

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(Text.assemble(("Stop the script?", "bold"), "\n\n",
                                       "diag sends it SIGTERM (then SIGKILL after 5 s), with its "
                                       "DataLoader workers and other descendants. The findings stay "
                                       "here to browse.\n\n",
                                       ("y", "bold cyan"), " stop it   ", ("n", "bold cyan"),
                                       " keep it running"))

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)
