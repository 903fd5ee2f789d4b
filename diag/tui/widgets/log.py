"""The Log tab: the script's stdout and stderr as they come, scrollable.

Lines wait in the app's buffer while the tab is hidden or updates are paused and are written here
when it is shown. Every line is also in the run directory's log.txt (the note at the top says
where), so nothing is lost even beyond what the widget keeps."""
from __future__ import annotations

import os

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import RichLog, Static

from diag.sanitize import for_terminal, strip_ansi
from diag.tui.fmt import short_path
from diag.tui.live import LOG_LINES_KEPT
from diag.tui.widgets import Pane, UIState


class LogPane(Pane):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.lines_written = 0
        self._note_key = None

    def compose(self) -> ComposeResult:
        yield Static(id="log-info")
        yield RichLog(id="log", max_lines=LOG_LINES_KEPT, wrap=True, markup=False, highlight=False,
                      auto_scroll=True, min_width=40)

    def data_key(self, state: UIState):
        return (state.log_path, state.extra.get("log_dropped", 0), self.lines_written)

    def refresh_data(self, state: UIState) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("the script's output", style="bold")
        t.append(" (stderr in red)", style="red")
        if state.log_path:
            t.append(" · every line is also in ", style="dim")
            t.append(short_path(state.log_path, os.getcwd()), style="dim underline")
        dropped = state.extra.get("log_dropped", 0)
        if dropped:
            t.append(f" · {dropped} early lines only in the log file", style="yellow")
        self.query_one("#log-info", Static).update(t)

    def write_lines(self, lines: list[tuple[str, str]]) -> None:
        log = self.query_one("#log", RichLog)
        for stream, line in lines:
            # the script's own text: colour codes dropped, other control characters shown escaped
            text = Text(for_terminal(strip_ansi(line.rstrip("\n")).expandtabs()),
                        style="red" if stream == "stderr" else "")
            log.write(text)
        self.lines_written += len(lines)
