"""Console report for people (rich): findings grouped by severity, each with its numbers, why it
matters, the fix and a snippet, and the location in the user's script."""
from __future__ import annotations

import re

from rich.console import Console, Group
from rich.padding import Padding
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


def run_header(evidence, verbose: bool = True) -> Text:
    """The run in a few lines: script, status, steps and median phases, evaluation, the probe's own
    cost (its reason in full with ``verbose``), simulated GPUs, notes."""
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
    counts = sorted({r.step_stats.count for r in evidence.ranks})
    steps = sum(counts)
    if steps or not evidence.ranks or evidence.run_kind() != "evaluation":
        if len(evidence.ranks) > 1:   # each rank runs the same loop: its own count, not their sum
            per = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
            t.append(f" · {per} step(s) per rank")
        else:
            t.append(f" · {steps} step(s)")
    if evidence.ranks:
        med = evidence.primary.median_step()
        if med:
            t.append(f" · median step {fmt_seconds(med['total_s'])} "
                     f"(data {fmt_seconds(med['data_s'])} / fwd {fmt_seconds(med['forward_s'])} / "
                     f"bwd {fmt_seconds(med['backward_s'])} / opt {fmt_seconds(med['optimizer_s'])} / "
                     + (f"comm {fmt_seconds(med['comm_s'])} / " if "comm_s" in med else "")
                     + f"other {fmt_seconds(med['other_s'])})")
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
    summary = probe_cost.of_evidence(evidence)
    own = probe_cost.headline(summary) if verbose else probe_cost.short_headline(summary)
    if own:
        t.append(f"\n{own}", style="dim")
    sampling = probe_cost.sampling_line(evidence.primary) if evidence.ranks else None
    if sampling:      # the probe's cost budget sampled its per-step extras (docs/performance.md)
        t.append(f"\n{safe(sampling)}", style="dim")
    if run.simulated_gpus:
        t.append(f"\nGPU values are SIMULATED (scenario '{safe(run.simulated_gpus)}')", style="bold magenta")
    for note in evidence.notes:
        t.append(f"\nnote: {safe(note)}", style="dim")
    return t


def finding_fields(f) -> str:
    """The finding's raw numbers as one ``key=value · ...`` line (shown with -v; JSON has them all)."""
    nums = {k: v for k, v in f.evidence.items() if k not in ("traceback", "message") and v is not None
            and not isinstance(v, (dict, list))}
    return " · ".join(f"{k}={fmt_value(v)}" for k, v in list(nums.items())[:10])


def render_finding(f, verbose: bool = False) -> Group:
    """One finding: a heading (severity, id, title), then its message (the measured numbers), the fix
    and its snippet, the location, indented under it; an info finding shows its message and location
    only. With -v: everything, with why it matters and the raw fields (``key=value · ...``; JSON has
    them all). No box: the docs link (print_finding) stays one line."""
    f = safe_finding(f)
    style, label = STYLE[f.severity]
    parts: list = [Text(f.message)]
    fields = finding_fields(f) if verbose else ""
    if fields:
        parts.append(Text(fields, style="dim"))
    if f.why and verbose:
        parts.append(Text.assemble(("why: ", "bold"), f.why))
    full = verbose or f.severity.rank > Severity.INFO.rank     # an info finding: its message and line
    if f.fix and full:
        parts.append(Text.assemble(("fix: ", "bold green"), f.fix))
    if f.snippet and full:
        parts.append(Syntax(f.snippet, "python", theme="ansi_dark", background_color="default", word_wrap=True))
    if f.location:
        parts.append(Text.assemble(("at: ", "bold"), str(f.location)))
    title = Text.assemble((f" {label} ", style + " reverse"), " ", (f.id, "bold"), " — ", f.title)
    return Group(title, Padding(Group(*parts), (0, 0, 0, 2)))


def print_finding(console: Console, f, verbose: bool = False) -> None:
    """Print a finding and its docs link: the link on a line of its own, never cut or wrapped by
    diag (a terminal wraps it; a pasted or saved report keeps the whole address), then a blank line."""
    console.print(render_finding(f, verbose=verbose))
    docs = safe_finding(f).docs
    if docs and (verbose or f.severity.rank > Severity.INFO.rank):
        console.print(Text("  " + docs, style="dim underline"), crop=False, no_wrap=True, overflow="ignore")
    console.print()


_GPU_WORDS = re.compile(r"\b(cuda|gpus?|nvml|cudnn|tensor cores?|nvidia)\b|(trains|runs|are) on cpu", re.I)


def _skip_group(f, cpu_run: bool) -> str:
    """Which folded line a skipped check joins (the reason shared by the group)."""
    msg = f.message or ""
    if (f.evidence or {}).get("reason") == "not observable by sampling" or msg.startswith("Only evidence sampled"):
        return "attach"
    if cpu_run and _GPU_WORDS.search(msg):
        return "gpu"
    if "single-process" in msg.lower():
        return "single"
    return "other"


def folded_quiet(findings, evidence) -> list[Text]:
    """Passed and skipped checks folded to one line per group: the passed checks, the GPU checks a
    CPU run skips (with why), the multi-process checks a single process skips, those only an attached
    job answers, and the other skipped checks. Each line is cut to the terminal; -v lists them all."""
    cpu_run = bool(evidence.ranks) and not any(
        str(d).startswith("cuda") for r in evidence.ranks for m in r.models for d in (m.devices or []))
    passed = [f for f in findings if f.severity is Severity.PASS]
    skipped = [f for f in findings if f.severity is Severity.SKIPPED]
    groups: dict[str, list] = {"gpu": [], "single": [], "attach": [], "other": []}
    single = len(evidence.ranks) <= 1
    for f in skipped:
        g = _skip_group(f, cpu_run)
        groups["other" if g == "single" and not single else g].append(f)
    gpu_why = "a CPU run"
    if any("NVML" in (f.message or "") for f in groups["gpu"]):
        gpu_why += ", no NVIDIA driver"
    what = {"gpu": ("GPU check", f"skipped ({gpu_why})"),
            "single": ("multi-process check", "skipped (a single process)"),
            "attach": ("check", "skipped (only for a job sampled by diag attach)"),
            "other": ("other check", "skipped")}
    lines = []

    def line(label_sev, n: int, noun: str, why: str, members) -> Text:
        style, label = STYLE[label_sev]
        t = Text()
        t.append(f"{label:<9} ", style=style)
        t.append(f"{n} {noun}{'s' if n != 1 else ''} {why}: ", style="bold" if label_sev is Severity.PASS else "")
        t.append(", ".join(safe(f.id) for f in members), style="dim")
        return t

    if passed:
        lines.append(line(Severity.PASS, len(passed), "check", "passed", passed))
    for key in ("gpu", "single", "attach", "other"):
        if groups[key]:
            noun, why = what[key]
            lines.append(line(Severity.SKIPPED, len(groups[key]), noun, why, groups[key]))
    return lines


def render_console(evidence, findings, console: Console, verbose: bool = False) -> None:
    console.print(run_header(evidence, verbose=verbose))
    console.print()
    findings = sort_findings(findings)
    shown = [f for f in findings if f.severity.rank >= Severity.INFO.rank]
    for f in shown:
        print_finding(console, f, verbose=verbose)
    rest = [f for f in findings if f.severity in (Severity.PASS, Severity.SKIPPED)]
    if rest and not verbose:
        for ln in folded_quiet(rest, evidence):
            console.print(ln, no_wrap=True, overflow="ellipsis")
        console.print(Text("(-v: every check's reason; each finding in full: why, fix, raw numbers)",
                           style="dim"))
    elif rest:
        # -v: passed and skipped checks a line each, the message in full
        table = Table(show_header=False, box=None, pad_edge=False)
        table.add_column(min_width=8, no_wrap=True)
        table.add_column(min_width=max(len(f.id) for f in rest), no_wrap=True)
        table.add_column(style="dim")
        for f in rest:
            style, label = STYLE[f.severity]
            table.add_row(Text(label, style=style), safe(f.id), safe(f.message))
        console.print(table)
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
