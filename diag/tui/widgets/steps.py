"""The Steps tab: where a training step's time goes (data wait / forward / backward / optimizer),
throughput, a history graph, the current step and epoch, and one row per rank."""
from __future__ import annotations

import os
import statistics

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Sparkline, Static

from diag.sanitize import for_terminal as safe
from diag.tui import fmt
from diag.tui.models.steps import eval_phase_shares, phase_shares, summarize_attach, summarize_steps
from diag.tui.widgets import Pane, UIState

PHASE_STYLE = {"data_s": "red", "forward_s": "cyan", "backward_s": "blue", "optimizer_s": "green",
               "other_s": "grey50", "h2d_s": "yellow"}


def eval_text(s) -> Text:
    """The evaluation line: an evaluation run's steps, or a training run's evaluation passes."""
    t = Text()
    e = s.eval
    if not e:
        return t
    t.append("evaluation run" if s.kind == "evaluation" else "evaluation", style="bold bright_cyan")
    t.append(f" · {e['steps']} evaluation step(s) (one forward on one batch)")
    if s.evaluation and s.kind != "evaluation":
        t.append(f" in {s.evaluation['passes']} pass(es)")
    t.append("\n")
    t.append("throughput ")
    t.append(f"{fmt.si(e['batches_per_s'])} batches/s", style="bold")
    if e.get("samples_per_s"):
        t.append(f" · {fmt.si(e['samples_per_s'])} samples/s", style="bold")
    if e.get("tokens_per_s"):
        t.append(f" · {fmt.si(e['tokens_per_s'])} tokens/s", style="bold")
    if e.get("median_step_s"):
        t.append(f" · median evaluation step {fmt.ms(e['median_step_s'])}", style="dim")
    sh = s.eval_share
    if sh:
        t.append("\n")
        t.append(f"evaluation took {fmt.pct(sh['share'])} of training+evaluation time", style="bold")
        if sh.get("every"):
            t.append(f" (a pass every {sh['every']:.0f} steps, {fmt.ms(sh['per_pass_s'])} each; "
                     "diag cost --from RUN prices other intervals)", style="dim")
    return t


def eval_table(s) -> Table | Text:
    rows = eval_phase_shares(s.eval)
    if not rows:
        return Text("")
    return Group(eval_text(s), _phase_table(rows, "evaluation step", s.eval["phases"]["total_s"]))


def _phase_table(rows, step: str, total_s: float) -> Table:
    """One row per phase (time, share, a bar) and the step's total: "phase (median <step>)"."""
    table = Table(box=None, pad_edge=False, padding=(0, 1), expand=True, show_edge=False)
    table.add_column(f"phase (median {step})", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    table.add_column("", ratio=1, no_wrap=True)
    for key, label, secs, share in rows:
        style = PHASE_STYLE[key]
        table.add_row(Text(label, style=style), fmt.ms(secs), fmt.pct(share),
                      ProgressBar(total=1.0, completed=min(share, 1.0), width=None,
                                  complete_style=style, finished_style=style, style="grey23"))
    table.add_row(Text(step, style="bold"), Text(fmt.ms(total_s), style="bold"), "", "")
    return table


def summary_text(s, ev) -> Text:
    t = Text()
    if s.step == 0 and s.kind == "evaluation":
        t.append("an evaluation run: no training step, none expected", style="bold")
        t.append(" — its evaluation steps are below", style="dim")
        return t
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
    return _phase_table(rows, "step", s.median["total_s"])


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


ATTACH_PHASE_STYLE = {"data": "red", "forward": "cyan", "backward": "blue", "optimizer": "green",
                      "sync": "yellow", "collective": "magenta", "evaluation": "bright_cyan",
                      "checkpoint": "bright_magenta", "logging": "grey62", "other": "grey50"}
RANK_COLUMNS = ("data", "forward", "backward", "optimizer", "sync", "collective", "other")


def _where(d: dict | None) -> str:
    if not d:
        return "?"
    return f"{os.path.basename(str(d.get('file') or '?'))}:{d.get('line')}"


def attach_intro(a) -> Text:
    t = Text()
    t.append("sampled shares, not timings", style="bold yellow")
    window = f"{a.window_s:.1f} s" if a.window_s else "the window"
    rate = f" at {a.rate_hz:g} Hz" if a.rate_hz else ""
    t.append(f" · {safe(a.sampler)} read the job's stacks from outside for {window}{rate}; sampling records no "
             "steps, so each figure is the share of the main thread's samples in a phase (± its 95% margin "
             "from the number of samples), not a step time", style="dim")
    return t


def attach_ranks_table(a) -> Table:
    """--job: the ranks side by side, one row each."""
    table = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, header_style="bold",
                  title="ranks side by side (share of samples)", title_justify="left", title_style="bold")
    for col in ("rank", "PID", "samples", *RANK_COLUMNS, "hottest line"):
        table.add_column(col, justify="left" if col in ("rank", "hottest line") else "right", no_wrap=True)
    for r in a.ranks:
        shares = {p: s for p, _, s, _ in r.phases}
        top = r.hot_lines[0] if r.hot_lines else None
        row = [Text(str(r.rank), style="bold red" if r.stuck else ""), str(r.pid or ""), str(r.samples)]
        row += [fmt.pct(shares[p]) if shares.get(p) else Text("·", style="dim") for p in RANK_COLUMNS]
        row.append(Text("STUCK " + safe(_where(r.stuck.get("where") or r.stuck.get("innermost"))), style="bold red")
                   if r.stuck else safe(_where(top)) if top else "")
        table.add_row(*row)
    return table


def attach_rank_renderable(r, multi: bool):
    parts: list = []
    head = Text()
    head.append(f"rank {r.rank} · " if multi else "", style="bold")
    head.append(f"PID {r.pid}" if r.pid is not None else "PID ?", style="bold")
    head.append(f" · {r.samples} samples")
    if r.cycles is not None:
        head.append(f" · {r.cycles} step-like cycles" if r.cycles else " · no step-like cycle seen",
                    style="" if r.cycles else "yellow")
    if r.cpu_percent is not None:
        head.append(f" · CPU {r.cpu_percent:.0f}%")
    if not r.alive:
        head.append(" · ended during the window", style="yellow")
    parts.append(head)
    if r.stuck:
        st = r.stuck
        t = Text()
        t.append(" STUCK ", style="bold white on red")
        t.append(f" at {safe(_where(st.get('where') or st.get('innermost')))}")
        code = (st.get("where") or st.get("innermost") or {}).get("code")
        if code:
            t.append(f" `{safe(str(code))}`", style="bold")
        if st.get("waits_on"):
            t.append(f" — waits on {safe(str(st['waits_on']))}")
        if st.get("seconds_at_least"):
            t.append(f" for at least {st['seconds_at_least']:g} s", style="bold")
        parts.append(t)
    if not r.samples or not r.phases:
        parts.append(Text("no main-thread samples in this window", style="dim"))
        return Group(*parts)
    table = Table(box=None, pad_edge=False, padding=(0, 1), expand=True, show_edge=False)
    table.add_column("phase (share of samples)", no_wrap=True)
    table.add_column("samples", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    table.add_column("±95%", justify="right", no_wrap=True)
    table.add_column("", ratio=1, no_wrap=True)
    for phase, n, share, margin in r.phases:
        style = ATTACH_PHASE_STYLE.get(phase, "grey50")
        table.add_row(Text(safe(phase), style=style), str(n), fmt.pct(share), f"±{fmt.pct(margin)}",
                      ProgressBar(total=1.0, completed=min(share, 1.0), width=None,
                                  complete_style=style, finished_style=style, style="grey23"))
    parts.append(table)
    if r.hot_lines:
        hot = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, header_style="bold",
                    title="hottest user lines", title_justify="left", title_style="bold")
        for col in ("share", "samples", "phase", "line", "code"):
            hot.add_column(col, justify="right" if col in ("share", "samples") else "left", no_wrap=True)
        for h in r.hot_lines:
            hot.add_row(fmt.pct(_share(h)), str(h.get("samples") or ""), safe(str(h.get("phase") or "")),
                        safe(_where(h)), safe(fmt.shorten(str(h.get("code") or ""), 60)))
        parts.append(hot)
    if r.workers:
        wt = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, header_style="bold",
                   title=f"DataLoader workers ({len(r.workers)})", title_justify="left", title_style="bold")
        for col in ("PID", "CPU", "busy", "spends it on"):
            wt.add_column(col, justify="left" if col == "spends it on" else "right", no_wrap=True)
        for w in r.workers:
            top = (w.get("top_frames") or [None])[0]
            cpu = w.get("cpu_percent")
            wt.add_row(str(w.get("pid") or "?"), f"{cpu:.0f}%" if isinstance(cpu, (int, float)) else "N/A",
                       fmt.pct(w.get("busy_share")) if w.get("busy_share") is not None else "N/A",
                       safe(f"{_where(top)} {top.get('code') or ''}".strip()) if top else
                       Text("waiting for work", style="dim"))
        parts.append(wt)
    else:
        parts.append(Text("DataLoader workers: none seen (num_workers=0, or no DataLoader): batches are built "
                          "in the main process", style="dim"))
    return Group(*parts)


def _share(d: dict) -> float | None:
    v = d.get("share")
    return float(v) if isinstance(v, (int, float)) else None


def attach_renderable(a):
    multi = len(a.ranks) > 1
    parts: list = [attach_intro(a), Text("")]
    if not a.ranks:
        parts.append(Text("no process was sampled in this window", style="dim"))
        return Group(*parts)
    if multi:
        parts += [attach_ranks_table(a), Text("")]
    for r in a.ranks:
        parts += [attach_rank_renderable(r, multi), Text("")]
    return Group(*parts)


class StepsPane(Pane):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="steps-scroll"):
            attach = Static(id="steps-attach")
            attach.display = False                 # shown for attached jobs only (diag tui --attach)
            yield attach
            yield Static(id="steps-summary")
            yield Static(id="steps-breakdown")
            rows = Static(id="steps-eval")
            rows.display = False
            yield rows
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
        a = summarize_attach(ev)
        self._show_attach(a is not None)
        if a is not None:
            self.query_one("#steps-attach", Static).update(attach_renderable(a))
            return
        s = summarize_steps(ev)
        self.query_one("#steps-summary", Static).update(summary_text(s, ev))
        self.query_one("#steps-breakdown", Static).update(breakdown_table(s))
        ev_rows = self.query_one("#steps-eval", Static)
        ev_rows.display = bool(s.eval)          # only runs that evaluated have evaluation rows
        if s.eval:
            ev_rows.update(eval_table(s))
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

    def _show_attach(self, on: bool) -> None:
        """An attached job has no step records: its sampled view replaces the step view (and back)."""
        self.query_one("#steps-attach").display = on
        for wid in ("#steps-summary", "#steps-breakdown"):
            self.query_one(wid).display = not on
        if on:
            self.query_one("#steps-eval").display = False
        if on:
            for wid in ("#steps-ranks", "#steps-spark-label", "#steps-spark", "#steps-data-label",
                        "#steps-data-spark"):
                self.query_one(wid).display = False
            if getattr(self.app, "baseline", None) is not None:
                self.query_one("#steps-baseline").display = False
        elif getattr(self.app, "baseline", None) is not None:
            self.query_one("#steps-baseline").display = True
