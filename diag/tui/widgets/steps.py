"""The Steps tab: where a training step's time goes (data wait / forward / backward / optimizer),
throughput, a history graph, the current step and epoch, and one row per rank."""
from __future__ import annotations

import statistics

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Sparkline, Static

from diag.sanitize import for_terminal as safe
from diag.tui import fmt
from diag.tui.models.steps import phase_shares, summarize_steps
from diag.tui.widgets import Pane, UIState

PHASE_STYLE = {"data_s": "red", "forward_s": "cyan", "backward_s": "blue", "optimizer_s": "green",
               "other_s": "grey50"}


def summary_text(s, ev) -> Text:
    t = Text()
    if s.step == 0:
        t.append("no training step seen yet", style="bold")
        t.append(" — a step ends at optimizer.step() (or after backward() without an optimizer)",
                 style="dim")
        return t
    t.append(f"step {s.step}", style="bold")
    if s.epoch is not None:
        t.append(f" · epoch {s.epoch}", style="bold")
    if s.median:
        t.append(f" · median step {fmt.ms(s.median['total_s'])}")
    t.append(f" · {s.timed} timed steps", style="dim")
    if s.instrumented:
        t.append(f" ({s.instrumented} instrumented by diag, excluded)", style="dim")
    t.append("\n")
    t.append("throughput ")
    t.append(f"{fmt.si(s.samples_s)} samples/s" if s.samples_s else "samples/s N/A",
             style="bold" if s.samples_s else "dim")
    if s.samples_s_all and s.samples_s:
        t.append(f" (whole run {fmt.si(s.samples_s_all)})", style="dim")
    t.append(" · ")
    if s.tokens_s:
        t.append(f"{fmt.si(s.tokens_s)} tokens/s", style="bold")
        if s.tokens_s_all:
            t.append(f" (whole run {fmt.si(s.tokens_s_all)})", style="dim")
    else:
        t.append("tokens/s N/A (inputs are not token ids)", style="dim")
    if s.batch:
        if s.micro_batches and s.micro_batches > 1:
            t.append(f" · batch {s.batch} × {s.micro_batches} accumulated", style="dim")
        else:
            t.append(f" · batch {s.batch}", style="dim")
    return t


def breakdown_table(s) -> Table | Text:
    rows = phase_shares(s.median)
    if not rows:
        return Text("")
    table = Table(box=None, pad_edge=False, padding=(0, 1), expand=True, show_edge=False)
    table.add_column("phase (median step)", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    table.add_column("", ratio=1, no_wrap=True)
    for key, label, secs, share in rows:
        style = PHASE_STYLE[key]
        table.add_row(Text(label, style=style), fmt.ms(secs), fmt.pct(share),
                      ProgressBar(total=1.0, completed=min(share, 1.0), width=None,
                                  complete_style=style, finished_style=style, style="grey23"))
    table.add_row(Text("step", style="bold"), Text(fmt.ms(s.median["total_s"]), style="bold"), "", "")
    return table


def history_label(values: list[float], what: str, unit: str) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(what, style="bold")
    if values:
        t.append(f" · last {len(values)} steps · min {min(values):.1f}{unit} · median "
                 f"{statistics.median(values):.1f}{unit} · max {max(values):.1f}{unit}", style="dim")
    return t


def baseline_table(base, ev) -> Table | Text:
    """The live run's median step and phases beside a saved baseline's (diag.compare's steady-state
    rule on both sides), with the deltas. Medians only: `diag compare` gives the intervals."""
    from diag.compare import extract

    live = extract.from_export(extract.export(ev), "live", [])
    if live.steady < extract.MIN_STEADY:
        return Text(f"baseline {base.source}: waiting for {extract.MIN_STEADY} steady-state steps "
                    "(warm-up and instrumented steps are left out on both sides)", style="dim")
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False,
                  title=f"vs baseline {base.source}", title_justify="left", title_style="bold")
    for col in ("median", "baseline", "now", "delta", ""):
        table.add_column(col, justify="left" if col == "median" else "right", no_wrap=True)
    rows = [("step", "total_s")] + [(p, f"{p}_s") for p in extract.PHASES]
    for label, key in rows:
        a = float(statistics.median(base.steps[key])) if base.steps.get(key) is not None and base.steps[key].size else None
        b = float(statistics.median(live.steps[key])) if live.steps[key].size else None
        if a is None or b is None:
            continue
        d = b - a
        rel = f"{d / a * 100:+.0f}%" if a > 0 else ""
        style = "red" if a > 0 and d / a > 0.05 and abs(d) > 1e-4 else ("green" if a > 0 and d / a < -0.05 else "")
        table.add_row(Text(label, style="bold" if key == "total_s" else PHASE_STYLE.get(key, "")),
                      fmt.ms(a), fmt.ms(b), Text(f"{d * 1000:+.1f} ms", style=style), Text(rel, style=style))
    return table


class StepsPane(Pane):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="steps-scroll"):
            yield Static(id="steps-summary")
            yield Static(id="steps-breakdown")
            if getattr(self.app, "baseline", None) is not None:
                yield Static(id="steps-baseline")
            table = DataTable(id="steps-ranks", cursor_type="none", zebra_stripes=True)
            for col in ("rank", "host", "status", "steps", "step", "data", "fwd", "bwd", "opt", "samples/s",
                        "tokens/s"):
                table.add_column(col, key=col)
            yield table
            yield Static(id="steps-spark-label", classes="spark-label")
            yield Sparkline([], id="steps-spark")
            yield Static(id="steps-data-label", classes="spark-label")
            yield Sparkline([], id="steps-data-spark")

    def refresh_data(self, state: UIState) -> None:
        ev = state.evidence
        if ev is None:
            self.query_one("#steps-summary", Static).update(Text("waiting for the script…", style="dim"))
            return
        s = summarize_steps(ev)
        self.query_one("#steps-summary", Static).update(summary_text(s, ev))
        self.query_one("#steps-breakdown", Static).update(breakdown_table(s))
        base = getattr(self.app, "baseline", None)
        if base is not None:
            self.query_one("#steps-baseline", Static).update(baseline_table(base, ev))
        has = bool(s.history_ms)
        for wid in ("#steps-spark-label", "#steps-spark", "#steps-data-label", "#steps-data-spark"):
            self.query_one(wid).display = has
        if has:
            self.query_one("#steps-spark-label", Static).update(
                history_label(s.history_ms, "step time (ms)", ""))
            self.query_one("#steps-spark", Sparkline).data = s.history_ms
            shares = [100 * x for x in s.data_share_history]
            self.query_one("#steps-data-label", Static).update(
                history_label(shares, "data wait (% of each step)", "%"))
            self.query_one("#steps-data-spark", Sparkline).data = shares
        table = self.query_one("#steps-ranks", DataTable)
        table.display = len(s.ranks) > 1
        if len(s.ranks) > 1:
            table.clear()
            slowest = max(s.ranks, key=lambda r: (r.median or {}).get("total_s") or 0.0)
            for r in s.ranks:
                m = r.median or {}
                style = "bold yellow" if r is slowest else ""
                table.add_row(Text(str(r.rank), style=style), safe(r.host), safe(r.status), str(r.steps),
                              Text(fmt.ms(m.get("total_s")), style=style), fmt.ms(m.get("data_s")),
                              fmt.ms(m.get("forward_s")), fmt.ms(m.get("backward_s")),
                              fmt.ms(m.get("optimizer_s")), fmt.si(r.samples_s), fmt.si(r.tokens_s))
