"""``diag try --format html``: the trials as one self-contained page (the what-if report), built from
the pieces of :mod:`diag.report.html` (the same shell, CSS, embedded Chart.js, content security
policy and render-status protocol as ``diag check --format html`` and ``diag compare --format html``).

What it shows: the summary line; the table of trials (knob, speed-up with its 95% interval, step,
samples/s, peak memory, verdict, judged steps: the rows of the text and markdown reports); for each
trial, what its verdict rests on, what the probe applied, and its judged step times' distribution
beside its baseline's on shared bins (a ``dist`` chart, as ``diag compare`` draws two sides); the fix
of each knob found faster in the run's framework's words; the knobs not tried (not applicable, left
out) with why; the notes and the runs.

Made from a :class:`diag.trial.engine.TryResult` or its JSON (``diag try --format json``): a saved
report renders the same page. Every string (script paths, knob specs, reasons, exception texts) goes
through :func:`~diag.report.html.esc` or the JSON island.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from diag.knobs import FRAMEWORK_NAMES
from diag.report.compare_html import binned_shares
from diag.report.html import Raw, chart, esc, page, table

DIST_BINS = 24
# the verdicts' badges (the CSS classes of the check report's severities)
VERDICT_BADGE = {"faster": "pass", "slower": "warning", "broke": "error", "no change": "skipped",
                 "unknown": "info", "not applicable": "skipped", "left out": "skipped"}


def _data(result) -> dict[str, Any]:
    """The report as ``diag try --format json`` writes it (so a saved one renders the same page)."""
    if hasattr(result, "to_dict"):
        import json

        from diag.report.try_ import render_json

        return json.loads(render_json(result))
    return dict(result)


def distribution(baseline: list[float], trial: list[float], bins: int = DIST_BINS) -> dict[str, Any] | None:
    """The two sides' judged step times (seconds) on shared bins, as shares of each side's steps (the
    sides have different step counts). A tail beyond 3x the 99th percentile goes into the last bin
    (``overflow``), so one stall does not squeeze the rest into a single bar. None when a side is empty."""
    a = np.asarray([x for x in baseline or [] if isinstance(x, (int, float)) and math.isfinite(x)], dtype=float)
    b = np.asarray([x for x in trial or [] if isinstance(x, (int, float)) and math.isfinite(x)], dtype=float)
    if not a.size or not b.size:
        return None
    return binned_shares([("without the knob", a), ("with the knob", b)], bins)


def _badge(verdict: str) -> Raw:
    return Raw(f'<span class="badge sev-{VERDICT_BADGE.get(verdict, "skipped")}">{esc(verdict)}</span>')


def _clock(data: dict) -> str:
    runs = data.get("runs") or []
    return ("the device clock (CUDA events)" if runs and all(r.get("clock") == "device" for r in runs)
            else "the wall clock")


def _header(data: dict) -> str:
    from diag.report.try_ import _ms

    fw = FRAMEWORK_NAMES.get(data.get("framework") or "torch", "plain PyTorch")
    b = data.get("baseline") or {}
    verdicts = [t.get("verdict") for t in data.get("trials") or []]
    tiles = [("framework", fw), ("device", data.get("device") or "cpu"),
             ("baseline step", f"{_ms(b.get('median_step_s'))} (median of {b.get('steps') or 0} steps)"
              if b.get("median_step_s") else "n/a"),
             ("step times on", _clock(data)),
             ("faster", f"{verdicts.count('faster')} of {len(verdicts)} trials"),
             ("time", f"{len(data.get('runs') or [])} run(s) in {data.get('elapsed_s') or 0:.0f} s "
                      f"of a {data.get('budget_s') or 0:.0f} s budget")]
    tiles_html = "".join(f'<div class="tile"><div class="k">{esc(k)}</div><div class="v" data-fact="{esc(k)}">'
                         f'{esc(v)}</div></div>' for k, v in tiles)
    good = "faster" in verdicts
    interrupted = ('<div class="banner sim" id="interrupted">Interrupted: the trials finished before the '
                   'interruption are reported.</div>') if data.get("interrupted") else ""
    return (f'<header id="summary"><h1>diag try <span class="script">{esc(data.get("script"))}</span></h1>'
            f'{interrupted}<p class="verdict {"ok" if good else ""}" id="try-summary"><b>{esc(data.get("summary"))}</b></p>'
            f'<div class="tiles">{tiles_html}</div></header>')


def _table(data: dict) -> str:
    from diag.report.try_ import HEAD, _mem, _ms, _rate, _speed

    rows, classes = [], []
    for t in data.get("trials") or []:
        knob = t["knob"] + (" (combined)" if t.get("kind") == "combined" else "")
        rows.append((Raw(f'<a href="#trial-{_slug(t["knob"])}"><code>{esc(knob)}</code></a>'), _speed(t),
                     _ms(t.get("step_s")), _rate(t), _mem(t), _badge(t.get("verdict", "")), str(t.get("steps") or 0)))
        classes.append("improved" if t.get("verdict") == "faster" else "regression" if t.get("verdict") in
                       ("slower", "broke") else "")
    for n in data.get("not_tried") or []:
        rows.append((Raw(f"<code>{esc(n['knob'])}</code>"), "-", "-", "-", "-", _badge(n["verdict"]), "0"))
        classes.append("")
    if not rows:
        return ('<section id="trials"><h2>Trials</h2><p class="muted">No knob was tried (the findings point to '
                'none; give --knob to choose).</p></section>')
    return ('<section id="trials"><h2>Trials</h2><p class="muted">Speed-up = the baseline\'s step / the '
            'trial\'s (10%-trimmed means), with its 95% interval; a verdict needs the interval to exclude 1x '
            'and 20 judged steps on each side (docs/try.md).</p>'
            + table(HEAD, rows, cls="trials", row_classes=classes) + "</section>")


def _slug(spec: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in str(spec))


def _what_if(data: dict, charts: dict[str, Any]) -> str:
    from diag.report.try_ import _ms

    trials = data.get("trials") or []
    if not trials:
        return ""
    out = ['<section id="what-if"><h2>What if: each trial against its baseline</h2>'
           f'<p class="muted">Judged step times on {esc(_clock(data))} (the first steps of each run or block left '
           'out), without and with the knob, on shared bins as a share of each side\'s steps.</p>']
    for i, t in enumerate(trials):
        slug = _slug(t["knob"])
        verdict = t.get("verdict", "")
        n = int(t.get("runs") or 0)
        kind = {"switch": f"{n} block(s) of steps in one process, alternated with the baseline's",
                "restart": f"{n} run(s) of its own, alternated with the baseline's",
                "combined": f"the winners combined, {n} run(s) or block(s)"}.get(t.get("kind"), t.get("kind") or "")
        out.append(f'<article class="trial" id="trial-{esc(slug)}" data-verdict="{esc(verdict)}">'
                   f'<h3>{_badge(verdict).html} <code>{esc(t["knob"])}</code> '
                   f'<span class="muted">({esc(kind)})</span></h3>')
        if t.get("why"):
            out.append(f'<p class="msg">{esc(t["why"])}</p>')
        facts = []
        if t.get("step_s") is not None:
            facts.append(f"step {_ms(t.get('baseline_step_s'))} → {_ms(t.get('step_s'))}")
        facts.append(f"{int(t.get('steps') or 0)} judged steps with the knob, {int(t.get('baseline_steps') or 0)} "
                     "without")
        if t.get("loss_change") is not None:
            facts.append(f"mean loss {t['loss_change']:+.1%}")
        out.append(f'<p class="muted">{esc("; ".join(facts))}</p>')
        if t.get("applied") and verdict != "not applicable":
            out.append(f'<p><span class="muted">applied:</span> {esc(t["applied"])}</p>')
        st = t.get("step_times") or {}
        dist = distribution(st.get("baseline") or [], st.get("trial") or [])
        if dist:
            cid = f"try-dist-{i}"
            charts[cid] = dist
            cap = "Step times of the judged steps, without and with the knob."
            if dist["overflow"]:
                cap += " The last bin also holds the long tail (beyond 3× the 99th percentile)."
            out.append(chart(cid, f"Step times: {t['knob']}", cap, height=220))
        else:
            out.append('<p class="muted">No distribution: a side has no judged steps.</p>')
        out.append("</article>")
    out.append("</section>")
    return "".join(out)


def _fixes(data: dict) -> str:
    from diag.report.try_ import fixes

    fx = fixes(data)
    if not fx:
        return ""
    fw = FRAMEWORK_NAMES.get(data.get("framework") or "torch", "plain PyTorch")
    out = [f'<section id="fixes"><h2>The fix, in {esc(fw)}\'s words</h2>']
    for spec, fix, snippet in fx:
        out.append(f'<article class="fix" data-knob="{esc(spec)}"><p><code>{esc(spec)}</code>: {esc(fix)}</p>')
        if snippet:
            out.append(f"<pre><code>{esc(snippet)}</code></pre>")
        out.append("</article>")
    out.append("</section>")
    return "".join(out)


def _not_tried(data: dict) -> str:
    rows = [(Raw(f"<code>{esc(n['knob'])}</code>"), _badge(n["verdict"]), n.get("why") or "")
            for n in data.get("not_tried") or []]
    notes = data.get("notes") or []
    if not rows and not notes:
        return ""
    out = [f'<section id="not-tried"><h2>{"Not tried, and why" if rows else "Notes"}</h2>']
    if rows:
        out.append(table(("knob", "verdict", "why"), rows, cls="not-tried"))
    if notes:
        out.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in notes) + "</ul>")
    out.append("</section>")
    return "".join(out)


def _runs(data: dict) -> str:
    runs = data.get("runs") or []
    if not runs:
        return ""
    rows = [(r.get("label") or "", r.get("status") or "", str(r.get("steps") or 0),
             f"{float(r.get('wall_s') or 0):.1f} s", r.get("clock") or "wall", r.get("run_dir") or "") for r in runs]
    return ('<section id="runs"><h2>The runs</h2>'
            + table(("run", "status", "steps", "wall time", "clock", "directory"), rows, cls="runs")
            + f'<p class="muted">Run directories (evidence, the script\'s output in log.txt) under '
              f'{esc(data.get("directory"))}.</p></section>')


def report_data(result) -> tuple[str, dict[str, Any]]:
    """(body markup, data island) of the page."""
    data = _data(result)
    charts: dict[str, Any] = {}
    sections = [("trials", "Trials", _table(data)), ("what-if", "What if", _what_if(data, charts)),
                ("fixes", "The fix", _fixes(data)), ("not-tried", "Not tried" if data.get("not_tried") else "Notes",
                                                     _not_tried(data)), ("runs", "Runs", _runs(data))]
    nav = " ".join(f'<a href="#{sid}">{esc(label)}</a>' for sid, label, html in sections if html)
    body = "".join([_header(data), f"<nav>{nav}</nav><main>", *(html for _, _, html in sections), "</main>"])
    # the island holds the report without the raw step times (the charts hold their histograms)
    slim = {**data, "trials": [{k: v for k, v in t.items() if k != "step_times"} for t in data.get("trials") or []]}
    return body, {"kind": "try", "try": slim, "charts": charts}


def render_html(result) -> str:
    body, data = report_data(result)
    verdicts = [t.get("verdict") for t in _data(result).get("trials") or []]
    return page(f"diag try — {verdicts.count('faster')} faster of {len(verdicts)}", body, data)
