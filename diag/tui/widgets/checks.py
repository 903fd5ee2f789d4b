"""The Checks tab: findings sorted by severity (re-judged as the run goes on) and a detail pane
with the line in the user's script, the fix and its snippet, why it matters, and the numbers."""
from __future__ import annotations

from rich.console import Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import DataTable, Static

from diag.findings import Finding, Severity, count_phrase
from diag.report.style import SEVERITY_STYLES, list_label
from diag.sanitize import for_terminal
from diag.tui import fmt
from diag.tui.widgets import Pane, UIState

def finding_keys(findings: list[Finding]) -> list[str]:
    """Stable row keys: the id, plus a counter when one check yields several findings."""
    seen: dict[str, int] = {}
    keys = []
    for f in findings:
        n = seen.get(f.id, 0)
        seen[f.id] = n + 1
        keys.append(f.id if n == 0 else f"{f.id}#{n}")
    return keys


def summary_text(state: UIState) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    findings = state.findings
    if state.snapshot is None:
        t.append("judging… the checks run as soon as the first evidence arrives", style="dim")
        return t
    counts = {s: 0 for s in Severity}
    for f in findings:
        counts[f.severity] += 1
    parts = []
    for s in (Severity.CRASHED, Severity.ERROR, Severity.WARNING, Severity.INFO, Severity.PASS,
              Severity.SKIPPED):
        if counts[s]:
            style = SEVERITY_STYLES[s].style
            parts.append((count_phrase(s, counts[s]), style))
    for i, (text, style) in enumerate(parts):
        t.append(text, style=style)
        if i < len(parts) - 1:
            t.append(" · ")
    ev = state.evidence
    steps = ev.primary.step_stats.count if ev.ranks else 0
    step = "step"
    if ev.ranks and not steps and ev.primary.eval_stats.count:
        # an evaluation run (so far): count its evaluation steps, not "0 steps"
        steps, step = ev.primary.eval_stats.count, "evaluation step"
    if state.snapshot.final or ev.run.status != "running":
        t.append(f"   judged on the whole run ({steps} {step}s)", style="dim")
    else:
        t.append(f"   re-judged live, last at {step} {steps}", style="dim")
    return t


def detail_renderable(f: Finding | None, cwd: str | None = None):
    if f is None:
        return Text("Select a finding to see its numbers, why it matters and how to fix it.",
                    style="dim")
    from diag.sanitize import safe_finding

    f = safe_finding(f)      # its strings came from evidence: no escape sequence reaches the terminal
    label, style = list_label(f.severity), SEVERITY_STYLES[f.severity].style
    parts: list = []
    head = Text()
    head.append(f" {label} ", style=style + " reverse")
    head.append(" ")
    head.append(f.title, style="bold")
    head.append(f"\n{f.id}", style="dim")
    parts.append(head)
    parts.append(Text(f.message))
    if f.location:
        loc = Text()
        loc.append("at ", style="bold")
        where = fmt.short_path(f.location.file, cwd)
        if f.location.line is not None:
            where += f":{f.location.line}"
        loc.append(where, style="underline")
        if f.location.function:
            loc.append(f" (in {f.location.function})", style="dim")
        parts.append(loc)
    # the fix first (it is what the reader came for: on 80x24 it shows without scrolling), then why,
    # then the raw numbers
    if f.fix:
        parts.append(Text.assemble(("fix ", "bold green"), f.fix))
    if f.snippet:
        parts.append(Syntax(f.snippet.rstrip("\n"), "python", theme="ansi_dark",
                            background_color="default", word_wrap=True))
    if f.why:
        parts.append(Text.assemble(("why it matters ", "bold"), f.why))
    nums = {k: v for k, v in (f.evidence or {}).items() if k != "traceback" and v is not None}
    if nums:
        table = Table(show_header=False, box=None, pad_edge=False, padding=(0, 1))
        table.add_column(style="dim", no_wrap=True)
        table.add_column(overflow="fold")
        for k, v in list(nums.items())[:16]:
            table.add_row(str(k), fmt.fmt_value(v))
        parts.append(Text("the numbers", style="bold"))
        parts.append(table)
    tb = (f.evidence or {}).get("traceback")
    if tb and f.severity is Severity.CRASHED:
        parts.append(Text(str(tb).rstrip(), style="magenta"))
    if f.docs:
        parts.append(Text.assemble(("source ", "bold"), (f.docs, "dim underline")))
    # blank lines between the parts
    spaced: list = []
    for i, p in enumerate(parts):
        if i:
            spaced.append(Text(""))
        spaced.append(p)
    return Group(*spaced)


class FindingsTable(DataTable):
    """The findings list. Its width settles a layout pass after the pane's (the narrow layout stacks
    the detail under it), and the columns depend on it: re-render the pane as soon as it changes
    rather than on the next tick."""

    def on_resize(self) -> None:
        pane = next((a for a in self.ancestors if isinstance(a, ChecksPane)), None)
        if pane is not None:
            pane.on_resize()


class ChecksPane(Pane):
    BORDER_TITLE = "Checks"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._findings: dict[str, Finding] = {}
        self._order: list[str] = []
        self._cwd: str | None = None
        self._selected: str | None = None
        self._layout: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="checks-summary")
        with Horizontal(id="checks-body"):
            yield FindingsTable(id="checks-table", cursor_type="row", zebra_stripes=False)
            with VerticalScroll(id="checks-detail-scroll"):
                yield Static(detail_renderable(None), id="checks-detail")

    def data_key(self, state: UIState):
        # the table's own width too: it settles a frame after the pane's when the layout changes
        try:
            tw = self.query_one("#checks-table", DataTable).size.width
        except Exception:
            tw = 0
        return (state.version, self.size.width, tw)

    def on_resize(self) -> None:
        app = self.app
        if getattr(app, "active_tab", None) == "checks" and hasattr(app, "view"):
            self.maybe_refresh(app.view)

    def refresh_data(self, state: UIState) -> None:
        self.query_one("#checks-summary", Static).update(summary_text(state))
        findings = state.findings
        ev = state.evidence
        self._cwd = ev.run.cwd if ev is not None else None
        keys = finding_keys(findings)
        new = dict(zip(keys, findings))
        table = self.query_one("#checks-table", DataTable)
        selected = self._selected
        # a wide table: severity | check id | title; a narrow one: severity | title (the id is in the detail)
        tw = table.size.width or max(40, self.size.width * 2 // 5)
        wide = tw >= 76
        title_w = max(16, tw - 15 - (28 if wide else 0))   # cell padding and the scrollbar
        rows = [(k, f.severity, for_terminal(f.title)) for k, f in zip(keys, findings)]
        # the cursor follows the most severe finding until the user moves it (focuses the table)
        follow = not table.has_focus
        if rows != self._order or (wide, title_w) != self._layout:
            if wide != (self._layout[0] if self._layout else None):
                table.clear(columns=True)
                table.add_column("severity", key="sev", width=8)
                if wide:
                    table.add_column("check", key="id", width=26)
                table.add_column("title", key="title")
            else:
                table.clear()
            self._layout = (wide, title_w)
            for key, f in zip(keys, findings):
                label, style = list_label(f.severity), SEVERITY_STYLES[f.severity].style
                title = Text(fmt.shorten(f.title, title_w), style="dim" if f.severity.rank <= 0 else "")
                cells = [Text(label, style=style)]
                if wide:
                    cells.append(Text(fmt.shorten(f.id, 26)))
                cells.append(title)
                table.add_row(*cells, key=key)
            self._order = rows
            if follow and keys:
                selected = keys[0]
            if selected in new:
                table.move_cursor(row=keys.index(selected), animate=False)
            elif keys:
                table.move_cursor(row=0, animate=False)
        self._findings = new
        if keys and (selected not in new):
            selected = keys[min(table.cursor_row, len(keys) - 1)] if table.cursor_row >= 0 else keys[0]
        self._show(selected)

    def _show(self, key: str | None) -> None:
        self._selected = key
        f = self._findings.get(key) if key else None
        self.query_one("#checks-detail", Static).update(detail_renderable(f, self._cwd))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key is not None else None
        if key != self._selected and key in self._findings:
            self._show(key)

    @property
    def selected(self) -> Finding | None:
        return self._findings.get(self._selected) if self._selected else None
