"""``diag compare --format html``: the comparison as one self-contained page, built from the pieces of
:mod:`diag.report.html` (the same shell, CSS, embedded Chart.js, content security policy and
render-status protocol as ``diag check --format html``).

What it shows: the verdict and the headline (step time with its interval and the phases that explain
it), the per-metric table with the confidence intervals and thresholds (the rows of the text, markdown
and JUnit reports: :func:`diag.report.compare.rows`), the phase attribution, charts of both sides'
step-time distributions, per-phase medians and step times, the findings diff, and what differs between
the runs. Made from the :class:`~diag.compare.core.Comparison` only.

Safe by construction as the check page: every string (file names, scripts, finding ids and messages,
environment facts) goes through :func:`~diag.report.html.esc` or the JSON island.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from diag.compare.core import Comparison, fmt_value, ms
from diag.compare.extract import PHASES, RunSample
from diag.report.html import MAX_POINTS, Raw, chart, downsample, esc, page, table

DIST_BINS = 30
SIDE_NAMES = ("base", "new")

_VERDICT_BADGE = {"REGRESSION": "error", "worse": "warning", "worse, within threshold": "warning",
                  "better": "pass", "not significant": "skipped", "same": "skipped", "n/a": "skipped",
                  "no interval": "skipped"}
_ROW_CLASS = {"REGRESSION": "regression", "better": "improved"}


def _r(x: Any, digits: int = 7) -> Any:
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return round(x, digits) if math.isfinite(x) else None
    return x


def _pooled(side: list[RunSample], key: str) -> np.ndarray:
    parts = [s.steps[key] for s in side if key in s.steps and s.steps[key].size]
    if not parts:
        return np.array([])
    v = np.concatenate(parts).astype(float)
    return v[np.isfinite(v)]


def _side_label(name: str, side: list[RunSample]) -> str:
    if len(side) == 1:
        return f"{name}: {side[0].source}"
    return f"{name}: {len(side)} runs"


def _sim(c: Comparison) -> str | None:
    names = sorted({str(s.facts.get("simulated_gpus")) for s in c.base + c.new if s.facts.get("simulated_gpus")})
    return ", ".join(names) if names else None


# ---- the data of the charts --------------------------------------------------------------------------

def distribution(c: Comparison, bins: int = DIST_BINS) -> dict[str, Any] | None:
    """Both sides' steady-state step times on shared bins, as shares of each side's steps (sides may
    have different step counts). A long tail beyond 3x the 99th percentile goes into the last bin
    (``overflow``), so one stall does not squeeze the rest into a single bar."""
    a, b = _pooled(c.base, "total_s"), _pooled(c.new, "total_s")
    if not a.size and not b.size:
        return None
    return binned_shares(list(zip(SIDE_NAMES, (a, b))), bins)


def binned_shares(named: list, bins: int = DIST_BINS) -> dict[str, Any]:
    """Samples of two (or more) sides, ``[(name, array), ...]``, on shared bins as shares of each side's
    count (the sides may have different counts): the ``dist`` chart of the compare and try pages. A
    long tail beyond 3x the 99th percentile goes into the last bin (``overflow``)."""
    both = np.concatenate([v for _n, v in named])
    lo, hi = float(both.min()), float(both.max())
    p99 = float(np.percentile(both, 99))
    overflow = hi > 3 * p99 and p99 > lo
    top = p99 if overflow else hi
    if top <= lo:
        top = lo + max(abs(lo) * 1e-3, 1e-9)
    edges = np.linspace(lo, top, bins + 1)
    sides = []
    for name, v in named:
        counts, _ = np.histogram(np.clip(v, lo, top), bins=edges)
        n = int(v.size)
        sides.append({"label": f"{name} ({n:,} steps)", "n": n,
                      "share": [_r(x / n, 5) if n else 0 for x in counts.tolist()]})
    return {"type": "dist", "edges": [_r(e) for e in edges.tolist()], "overflow": bool(overflow), "sides": sides}


def phase_medians(c: Comparison) -> dict[str, Any] | None:
    """Median of each phase over each side's steady steps, stacked: base beside new."""
    series: dict[str, list] = {}
    for p in PHASES:
        vals = []
        for side in (c.base, c.new):
            v = _pooled(side, f"{p}_s")
            vals.append(_r(float(np.median(v))) if v.size else None)
        series[p] = vals
    if all(v is None for vals in series.values() for v in vals):
        return None
    return {"type": "stack", "x": [n for n in SIDE_NAMES], "phases": list(PHASES), "series": series, "unit": "s"}


def step_lines(c: Comparison) -> dict[str, Any] | None:
    """Each run's steady-state step time in step order (ms), downsampled to the page's limit."""
    lines = []
    for name, side in zip(SIDE_NAMES, (c.base, c.new)):
        for i, s in enumerate(side):
            v = s.steps.get("total_s")
            if v is None or not v.size:
                continue
            d = downsample(list(range(1, int(v.size) + 1)), [float(x) * 1000 for x in v], MAX_POINTS)
            label = name if len(side) == 1 else f"{name} run {i + 1}"
            lines.append({"label": label, "x": d["x"], "y": [_r(y, 4) for y in d["med"]]})
    if not lines:
        return None
    return {"type": "lines", "unit": "ms", "xlabel": "steady-state step", "lines": lines}


# ---- sections ------------------------------------------------------------------------------------------

def _header(c: Comparison) -> str:
    from diag.report.compare import status_line

    bad = bool(c.regressions)
    verdict = "REGRESSION" if bad else "OK"
    step = c.metric("step_time")

    def side_tile(name, side):
        steps = "steady evaluation steps" if side[0].kind == "evaluation" else "steady steps"
        if len(side) == 1:
            s = side[0]
            return f"{s.source} — {s.steady:,} {steps} of {s.steps_total:,}"
        return f"{len(side)} runs — {sum(s.steady for s in side):,} {steps}"

    tiles = [
        ("verdict", Raw(f'<span class="status {"bad" if bad else "ok"}">{esc(verdict)}</span>')),
        ("exit code", str(c.exit_code)),
        ("step time", "n/a" if step is None or step.change is None else
         f"{fmt_value(step.a, 's')} → {fmt_value(step.b, 's')}"),
        ("confidence", f"{c.confidence * 100:g}%"),
        ("base", side_tile("base", c.base)),
        ("new", side_tile("new", c.new)),
    ]
    tiles_html = "".join(
        f'<div class="tile"><div class="k">{esc(k)}</div><div class="v" data-fact="{esc(k)}">'
        f'{v.html if isinstance(v, Raw) else esc(v)}</div></div>' for k, v in tiles)
    sim = _sim(c)
    sim_html = (f'<div class="banner sim" id="simulated">SIMULATED GPUs: GPU values on at least one side come '
                f'from the simulated scenario “{esc(sim)}”, not from real hardware.</div>') if sim else ""
    names = " vs ".join(esc(_side_label(n, s).split(": ", 1)[1]) for n, s in zip(SIDE_NAMES, (c.base, c.new)))
    return (f'<header id="summary"><h1>diag compare <span class="script" id="sides">{names}</span></h1>{sim_html}'
            f'<p class="verdict {"bad" if bad else "ok"}" id="verdict" data-verdict="{"regression" if bad else "ok"}">'
            f'<b>{esc(status_line(c))}</b></p>'
            f'<p class="headline" id="headline">{esc(c.headline)}</p>'
            f'<div class="tiles">{tiles_html}</div></header>')


def _metrics(c: Comparison, prefix: str = "", heading: bool = True) -> str:
    from diag.report.compare import rows

    rs = rows(c)
    body = []
    classes = []
    for r in rs:
        badge = _VERDICT_BADGE.get(r["verdict"], "skipped")
        body.append((Raw(f'<code>{esc(r["metric"])}</code>' if not r["metric"].startswith("· ") else
                         f'<span class="muted">·</span> {esc(r["metric"][2:])}'),
                     r["base"], r["new"], r["change"], r["ci"], r["threshold"],
                     Raw(f'<span class="badge sev-{badge}">{esc(r["verdict"])}</span>')))
        classes.append(_ROW_CLASS.get(r["verdict"], ""))
    conf = f"{int(c.confidence * 100)}% CI"
    return (f'<section id="{prefix}metrics">' + ("<h2>Metrics</h2>" if heading else "")
            + f'<p class="muted">A change is a regression only when its whole {esc(conf)} lies beyond the threshold; '
            'phases (·) explain the step time and are gated only when a threshold names them.</p>'
            + table(("metric", "base", "new", "change", conf, "threshold", "verdict"), body, cls="metrics",
                    row_classes=classes)
            + "</section>")


def _attribution(c: Comparison, charts: dict[str, Any], prefix: str = "", level: str = "h2") -> str:
    out = [f'<section id="{prefix}attribution"><{level}>Where the time went</{level}>']
    if c.attribution:
        rows = []
        for a in c.attribution:
            share = a.get("share_of_change")
            rows.append((a["phase"] + (f" ({a['clock']} clock)" if a.get("clock") else ""), ms(a.get("delta_s")),
                         f"{ms(a.get('low_s'))}…{ms(a.get('high_s'))}" if a.get("low_s") is not None else "—",
                         fmt_value(a.get("base_s"), "s"), fmt_value(a.get("new_s"), "s"),
                         f"{share:.0%}" if isinstance(share, (int, float)) else "—"))
        out.append(table(("phase", "median change", f"{int(c.confidence * 100)}% CI", "base", "new",
                          "share of the change"), rows, cls="attribution"))
    else:
        step = c.metric("step_time")
        why = ("the step time did not change significantly" if step is not None and step.verdict == "unchanged"
               else "no phase changed significantly in the direction of the step time")
        out.append(f'<p class="muted">No phase attribution: {esc(why)}.</p>')
    row = []
    med = phase_medians(c)
    if med:
        charts[prefix + "phases"] = med
        row.append(chart(prefix + "phases", "Median per phase, base vs new",
                         "Median of each phase over the steady-state steps of each side.", height=260))
    dist = distribution(c)
    if dist:
        charts[prefix + "dist"] = dist
        cap = "Steady-state step times on shared bins, as a share of each side's steps."
        if dist["overflow"]:
            cap += " The last bin also holds the long tail (beyond 3× the 99th percentile)."
        row.append(chart(prefix + "dist", "Distribution of step times, base vs new", cap, height=260))
    if row:
        out.append('<div class="grid2">' + "".join(row) + "</div>")
    lines = step_lines(c)
    if lines:
        charts[prefix + "steps"] = lines
        out.append(chart(prefix + "steps", "Step time per steady-state step",
                         "Warm-up and instrumented steps left out on both sides alike; long runs are "
                         "downsampled to bucket medians.", height=240))
    out.append("</section>")
    return "".join(out)


def _findings(c: Comparison, prefix: str = "", level: str = "h2") -> str:
    f = c.findings
    out = [f'<section id="{prefix}findings"><{level}>Findings, base → new</{level}>']
    if not (f.get("new") or f.get("gone") or f.get("changed")):
        out.append('<p class="muted">The same findings on both sides.</p>')

    def item(d, kind, extra=""):
        sev = str(d.get("severity") or "")
        where = f' <span class="muted">at</span> <code>{esc(d["location"])}</code>' if d.get("location") else ""
        msg = f'<p class="msg">{esc(d.get("message"))}</p>' if d.get("message") else ""
        return (f'<article class="finding sev-{esc(sev)}" data-diff="{esc(kind)}" data-id="{esc(d.get("id"))}">'
                f'<h3><span class="badge sev-{esc(sev)}">{esc(sev.upper())}</span> {esc(kind)}{extra}: '
                f'<code>{esc(d.get("id"))}</code>{" — " + esc(d["title"]) if d.get("title") else ""}{where}</h3>'
                f'{msg}</article>')

    for d in f.get("new") or []:
        out.append(item(d, "new"))
    for d in f.get("changed") or []:
        out.append(item(d, "changed", f' (was {esc(d.get("severity_before"))})'))
    for d in f.get("gone") or []:
        out.append(item(d, "gone"))
    out.append("</section>")
    return "".join(out)


def _runs(c: Comparison) -> str:
    from diag.report.compare import _excluded

    rows = []
    for name, side in zip(SIDE_NAMES, (c.base, c.new)):
        for s in side:
            fx = s.facts
            rows.append((name, s.source, fx.get("script_name") or fx.get("script") or "", s.status or "",
                         f"{s.steady:,} of {s.steps_total:,}", fx.get("batch") if fx.get("batch") is not None else "",
                         fx.get("device") or "", ", ".join(map(str, fx.get("gpu_models") or [])), fx.get("torch") or ""))
    out = ['<section id="runs"><h2>The runs</h2>',
           table(("side", "source", "script", "status", "steady steps", "batch", "device", "GPUs", "torch"), rows,
                 cls="runs")]
    if c.differences:
        drows = [(d["fact"], str(d.get("base")), str(d.get("new")),
                  "forced (--force)" if d["fact"] in c.forced else ("blocking" if d.get("blocking") else "informational"))
                 for d in c.differences]
        out.append("<h3>What differs between the runs</h3>" + table(("fact", "base", "new", ""), drows, cls="differences"))
    out.append(f'<p class="muted">{esc(_excluded(c))}.</p></section>')
    return "".join(out)


def baseline_section(c: Comparison, charts: dict[str, Any]) -> str:
    """The comparison inside a check page (``diag check --baseline --format html``): the verdict, the
    metric table, where the time went with its charts (ids prefixed ``baseline-``), the findings diff."""
    from diag.report.compare import status_line

    bad = bool(c.regressions)
    return (f'<section id="baseline"><h2>Compared with the baseline</h2>'
            f'<p class="verdict {"bad" if bad else "ok"}" id="baseline-verdict" '
            f'data-verdict="{"regression" if bad else "ok"}"><b>{esc(status_line(c))}</b></p>'
            f'<p class="headline">{esc(c.headline)}</p>'
            + _metrics(c, prefix="baseline-", heading=False)
            + _attribution(c, charts, prefix="baseline-", level="h3")
            + _findings(c, prefix="baseline-", level="h3") + "</section>")


def report_data(c: Comparison) -> tuple[str, dict[str, Any]]:
    """(body markup, data island) of the comparison page."""
    charts: dict[str, Any] = {}
    body = "".join([
        _header(c),
        '<nav><a href="#metrics">Metrics</a> <a href="#attribution">Where the time went</a> '
        '<a href="#findings">Findings</a> <a href="#runs">Runs</a></nav><main>',
        _metrics(c),
        _attribution(c, charts),
        _findings(c),
        _runs(c),
        "</main>",
    ])
    data = {"kind": "compare", "comparison": c.to_dict(), "charts": charts}
    return body, data


def render_html(c: Comparison) -> str:
    body, data = report_data(c)
    verdict = "regression" if c.regressions else "ok"
    return page(f"diag compare — {verdict}", body, data, simulated=_sim(c))
