"""Console report for people (rich): findings grouped by severity, each with its numbers, why it
matters, the fix and a snippet, and the location in the user's script."""
from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from diag.evidence import probe as probe_cost
from diag.findings import Severity, count_phrase, sort_findings
from diag.report import fmt_value
from diag.units import fmt_pct, fmt_seconds
from diag.redact import redact_args
from diag.report.style import SEVERITY_STYLES as STYLE
from diag.sanitize import for_terminal as safe, safe_finding


def eval_line(tp: dict, kind: str, ev_sum: dict | None, share: dict | None = None) -> str:
    """The summary's evaluation line: evaluation steps, their throughput and median phases."""
    rates = [f"{tp['batches_per_s']:.1f} batches/s"]
    if tp.get("samples_per_s"):
        rates.append(f"{tp['samples_per_s']:,.0f} samples/s")
    if tp.get("tokens_per_s"):
        rates.append(f"{tp['tokens_per_s']:,.0f} tokens/s")
    ph = tp.get("phases") or {}
    text = (f"evaluation: {tp['steps']} step(s) in {fmt_seconds(tp['time_s'])}"
            + (f" over {ev_sum['passes']} pass(es)" if ev_sum and ev_sum["passes"] > 1 else "")
            + f" · {', '.join(rates)}")
    if ph:
        text += (f" · median step {fmt_seconds(ph['total_s'])} (data {fmt_seconds(ph['data_s'])} / "
                 + (f"h2d {fmt_seconds(ph['h2d_s'])} / " if ph.get("h2d_s") else "")
                 + f"fwd {fmt_seconds(ph['forward_s'])} / other {fmt_seconds(ph['other_s'])})")
    if share:
        text += (f" · {fmt_pct(share['share'])} of training+evaluation time"
                 + (f" (a pass every {share['every']:.0f} steps)" if share.get("every") else ""))
    if kind == "training+evaluation":
        text += " (not part of the training steps)"
    return text


def run_header(evidence) -> Text:
    run = evidence.run
    t = Text()
    t.append("diag ", style="bold")
    if run.script:
        t.append(safe(f"{run.script} {' '.join(str(a) for a in redact_args(run.args))}".rstrip()))
    t.append("\n")
    status_style = {"completed": "green", "stopped": "green", "timeout": "yellow"}.get(run.status, "red")
    t.append("status: ")
    t.append(safe(run.status), style=status_style)
    if run.stop_reason:
        t.append(f" ({safe(run.stop_reason)})")
    steps = sum(r.step_stats.count for r in evidence.ranks)
    if steps or not evidence.ranks or evidence.run_kind() != "evaluation":
        t.append(f" · {steps} step(s)")
    if evidence.ranks:
        med = evidence.primary.median_step()
        if med:
            t.append(f" · median step {fmt_seconds(med['total_s'])} "
                     f"(data {fmt_seconds(med['data_s'])} / fwd {fmt_seconds(med['forward_s'])} / "
                     f"bwd {fmt_seconds(med['backward_s'])} / opt {fmt_seconds(med['optimizer_s'])} / "
                     f"other {fmt_seconds(med['other_s'])})")
        ev_sum = evidence.primary.evaluation_summary()
        kind = evidence.run_kind()
        tp = evidence.primary.eval_throughput()
        if kind == "evaluation":
            t.append(" · evaluation run")
        if tp:
            t.append("\n" + eval_line(tp, kind, ev_sum, evidence.primary.eval_share()))
        elif ev_sum:
            t.append(f"\nevaluation: {ev_sum['passes']} pass(es), {fmt_seconds(ev_sum['time_s'])} in all, "
                     f"{ev_sum['forwards']} forward(s), data wait {fmt_seconds(ev_sum['data_wait_s'])} "
                     "(not part of the training steps)")
        kids = [c for r in evidence.ranks for c in r.children]
        if kids:
            t.append(f"\nchild processes: {len(kids)} trained, "
                     f"{sum(c.steps for c in kids)} step(s) in all ({', '.join(str(c.steps) for c in kids[:8])})")
        fw = next((r.framework for r in evidence.ranks if r.framework is not None), None)
        if fw is not None and fw.name:
            t.append(f"\nframework: {safe(fw.name)}{' ' + safe(fw.version) if fw.version else ''}")
    if run.wall_s is not None:
        t.append(f" · {run.wall_s:.1f} s")
    if len(evidence.ranks) > 1:
        t.append(f" · {len(evidence.ranks)} ranks")
    own = probe_cost.headline(probe_cost.of_evidence(evidence))
    if own:
        t.append(f"\n{own}", style="dim")
    if run.simulated_gpus:
        t.append(f"\nGPU values are SIMULATED (scenario '{safe(run.simulated_gpus)}')", style="bold magenta")
    for note in evidence.notes:
        t.append(f"\nnote: {safe(note)}", style="dim")
    return t


def render_finding(f) -> Panel:
    f = safe_finding(f)
    style, label = STYLE[f.severity]
    parts: list = [Text(f.message)]
    nums = {k: v for k, v in f.evidence.items() if k not in ("traceback", "message") and v is not None
            and not isinstance(v, (dict, list))}
    if nums:
        parts.append(Text(" · ".join(f"{k}={fmt_value(v)}" for k, v in list(nums.items())[:10]), style="dim"))
    if f.why:
        parts.append(Text.assemble(("why: ", "bold"), f.why))
    if f.fix:
        parts.append(Text.assemble(("fix: ", "bold green"), f.fix))
    if f.snippet:
        parts.append(Syntax(f.snippet, "python", theme="ansi_dark", background_color="default"))
    if f.location:
        parts.append(Text.assemble(("at: ", "bold"), str(f.location)))
    if f.docs:
        parts.append(Text(f.docs, style="dim underline"))
    title = Text.assemble((f" {label} ", style), " ", (f.id, "bold"), " — ", f.title)
    return Panel(Group(*parts), title=title, title_align="left", border_style=style.replace("bold ", ""))


def render_console(evidence, findings, console: Console, verbose: bool = False) -> None:
    console.print(run_header(evidence))
    console.print()
    findings = sort_findings(findings)
    shown = [f for f in findings if f.severity.rank >= Severity.INFO.rank]
    for f in shown:
        console.print(render_finding(f))
    rest = [f for f in findings if f.severity in (Severity.PASS, Severity.SKIPPED)]
    if rest:
        # passed and skipped checks: a line each (the message cut to the terminal), in full with -v
        table = Table(show_header=False, box=None, pad_edge=False, expand=not verbose)
        table.add_column(min_width=8, no_wrap=True)
        table.add_column(min_width=max(len(f.id) for f in rest), no_wrap=True)
        if verbose:
            table.add_column(style="dim")
        else:
            table.add_column(style="dim", no_wrap=True, overflow="ellipsis", ratio=1)
        for f in rest:
            style, label = STYLE[f.severity]
            table.add_row(Text(label, style=style), safe(f.id), safe(f.message))
        console.print(table)
        if not verbose:
            console.print(Text("(-v shows the passed and skipped checks' messages in full)", style="dim"))
    counts = {s: sum(1 for f in findings if f.severity is s) for s in Severity}
    summary = Text("\n")
    for s in (Severity.CRASHED, Severity.ERROR, Severity.WARNING, Severity.INFO, Severity.PASS, Severity.SKIPPED):
        if counts[s]:
            style, _ = STYLE[s]
            summary.append(count_phrase(s, counts[s]), style=style)
            summary.append("  ")
    console.print(summary)
    run = evidence.run
    if run.run_dir:
        console.print(Text(f"run directory: {safe(run.run_dir)} (evidence.json, log.txt, report.json)", style="dim"))
