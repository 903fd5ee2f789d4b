"""Text report for ``diag attach``: what each process did during the window (phases, hottest lines,
workers, GPU), then the findings as ``diag check`` shows them."""
from __future__ import annotations

import re

from rich.console import Console
from rich.table import Table
from rich.text import Text

from diag.findings import Severity, count_phrase, sort_findings

_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def clean(s) -> str:
    """Text that came from the target (paths, code lines, command lines) without control characters."""
    return _CTRL.sub("?", str(s))


def _bar(share: float, width: int = 20) -> str:
    n = int(round(share * width))
    return "█" * n + "·" * (width - n)


def render_header(evidence, console: Console) -> None:
    run = evidence.run
    t = Text()
    t.append("diag attach ", style="bold")
    t.append(clean(" ".join(run.command)[:160]))
    t.append(f"\nsampled {run.wall_s or 0:.1f} s at {run.limits.get('rate_hz')} Hz · status: ")
    t.append(run.status, style="green" if run.status == "running" else "yellow")
    if run.stop_reason:
        t.append(f" ({clean(run.stop_reason)})")
    if len(evidence.ranks) > 1:
        t.append(f" · {len(evidence.ranks)} ranks")
    if run.simulated_gpus:
        t.append(f"\nGPU values are SIMULATED (scenario '{run.simulated_gpus}')", style="bold magenta")
    console.print(t)
    phases = ("data", "forward", "backward", "optimizer", "evaluation", "sync", "collective", "checkpoint",
              "logging", "other")
    mains = [((r.extras or {}).get("attach") or {}).get("main") or {} for r in evidence.ranks]
    shown = [p for p in phases if any(((m.get("phases") or {}).get(p) or {}).get("share", 0) >= 0.005
                                      for m in mains)] or ["other"]
    table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
    table.add_column("process", no_wrap=True)
    table.add_column("samples", justify="right")
    for p in shown:
        table.add_column(p, justify="right")
    table.add_column("CPU", justify="right")
    hot_rows = []
    for r in evidence.ranks:
        a = (r.extras or {}).get("attach") or {}
        main = a.get("main") or {}
        ph = main.get("phases") or {}
        label = f"rank {r.rank} (PID {a.get('pid')})" if len(evidence.ranks) > 1 else f"PID {a.get('pid')}"
        cells = []
        for p in shown:
            s = (ph.get(p) or {}).get("share", 0.0)
            cells.append(f"{100 * s:.0f}%" if s >= 0.005 else "·")
        cpu = a.get("cpu_percent")
        table.add_row(label, str(main.get("samples", 0)), *cells, "" if cpu is None else f"{cpu:.0f}%")
        for w in a.get("workers") or []:
            busy = w.get("busy_share")
            wcpu = w.get("cpu_percent")
            table.add_row(Text(f"  worker {w['pid']}", style="dim"), str(w.get("samples", 0)),
                          Text("busy " + ("?" if busy is None else f"{100 * busy:.0f}%"), style="dim"),
                          *[""] * (len(shown) - 1), "" if wcpu is None else f"{wcpu:.0f}%")
        for h in (main.get("hot_lines") or [])[:3]:
            hot_rows.append(f"{label}: {100 * h['share']:.0f}% {h['phase']:<9} "
                            f"{h['file'].rsplit('/', 1)[-1]}:{h['line']} {h.get('code') or ''}")
        for w in (a.get("workers") or [])[:4]:
            wt = (w.get("top_frames") or [None])[0]
            if wt:
                hot_rows.append(f"  worker {w['pid']}: {100 * wt['share']:.0f}% "
                                f"{wt['file'].rsplit('/', 1)[-1]}:{wt['line']} {wt.get('code') or ''}")
    console.print(table)
    if hot_rows:
        console.print(Text("hottest lines (share of samples, phase):", style="bold"))
        for row in hot_rows:
            console.print(Text("  " + clean(row), overflow="ellipsis", no_wrap=True))
    g = evidence.gpu or {}
    devs = g.get("devices") or []
    if devs:
        parts = []
        for d in devs[:16]:
            st = d.get("stats") or {}
            util = st.get("util_mean")
            mem = st.get("mem_used_max")
            parts.append(f"GPU{d.get('index')} util {'N/A' if util is None else f'{util:.0f}%'}"
                         + ("" if mem is None else f" mem {mem / (1 << 30):.1f} GiB")
                         + ("" if st.get("run_mem_max") is None else f" (this job {st['run_mem_max'] / (1 << 30):.1f} GiB)")
                         + (" (job)" if d.get("used_by_run") else ""))
        console.print(Text("gpus: " + " · ".join(parts), style="dim"))
    elif g.get("reason"):
        console.print(Text(f"gpus: {clean(g['reason'])}", style="dim"))
    for note in evidence.notes:
        console.print(Text(f"note: {clean(note)}", style="dim"))
    console.print()


def render_text(evidence, findings, console: Console, verbose: bool = False) -> None:
    from diag.report.console import STYLE, print_finding

    render_header(evidence, console)
    findings = sort_findings(findings)
    for f in findings:
        if f.severity.rank >= Severity.INFO.rank:
            print_finding(console, f, verbose=verbose)
    rest = [f for f in findings if f.severity in (Severity.PASS, Severity.SKIPPED)]
    from diag.checks.api import NOT_OBSERVABLE   # the registry's reason for a check sampling cannot answer

    unobservable = [f for f in rest if (f.evidence or {}).get("reason") == NOT_OBSERVABLE]
    if not verbose:
        rest = [f for f in rest if f not in unobservable]
    if rest:
        table = Table(show_header=False, box=None, pad_edge=False, expand=not verbose)
        table.add_column(min_width=8, no_wrap=True)
        table.add_column(min_width=max(len(f.id) for f in rest), no_wrap=True)
        table.add_column(style="dim", no_wrap=not verbose, overflow="fold" if verbose else "ellipsis", ratio=1)
        for f in rest:
            style, label = STYLE[f.severity]
            table.add_row(Text(label, style=style), f.id, f.message)
        console.print(table)
    if unobservable and not verbose:
        console.print(Text(f"SKIPPED   {len(unobservable)} checks not observable by sampling (they read what only "
                           "diag check's probe records; -v lists them): "
                           + ", ".join(f.id for f in unobservable), style="dim"))
    summary = Text("\n")
    for s in (Severity.CRASHED, Severity.ERROR, Severity.WARNING, Severity.INFO, Severity.PASS, Severity.SKIPPED):
        n = sum(1 for f in findings if f.severity is s)
        if n:
            summary.append(count_phrase(s, n), style=STYLE[s][0])
            summary.append("  ")
    console.print(summary)
    if evidence.run.run_dir:
        console.print(Text(f"evidence: {evidence.run.run_dir}/evidence.json (diag attach --from it to re-judge)",
                           style="dim"))
