"""Renderers for `diag compare` (and `diag check --baseline`): text (rich), json, markdown, junit,
and GitHub Actions workflow commands. Each takes a :class:`diag.compare.core.Comparison`."""
from __future__ import annotations

import json
from xml.etree import ElementTree as ET

from diag.compare.core import Comparison, MetricResult, fmt_value, ms, pct

VERDICT_WORDS = {"regression": "REGRESSION", "worse": "worse", "improved": "better",
                 "unchanged": "not significant", "unknown": "n/a"}


def _change(m: MetricResult) -> str:
    if m.key == "data_share" and m.delta is not None:
        return f"{m.delta * 100:+.1f} pts"
    if m.is_phase and m.delta is not None:
        return ms(m.delta)
    return pct(m.change)


def _ci(m: MetricResult, c: Comparison) -> str:
    if m.low is None or m.high is None:
        return "—"
    if m.key == "data_share":
        return f"{m.low * 100:+.1f}…{m.high * 100:+.1f} pts"
    if m.is_phase and m.delta_low is not None:
        return f"{ms(m.delta_low)}…{ms(m.delta_high)}".replace(" ms…", "…")
    if m.method == "single-value" and m.low == m.high:
        return "exact"
    return f"{pct(m.low)}…{pct(m.high)}"


def _threshold(m: MetricResult) -> str:
    if not m.gated or m.threshold is None:
        return ""
    return f"{m.threshold * 100:g}%"


def rows(c: Comparison) -> list[dict[str, str]]:
    """The table every renderer shows: one row per metric."""
    out = []
    for m in c.metrics:
        verdict = VERDICT_WORDS[m.verdict]
        if m.verdict == "regression" and not m.gated:
            verdict = "worse"
        elif m.verdict == "worse" and m.gated:
            verdict = "worse, within threshold"
        elif m.verdict == "unknown" and m.method == "single-value":
            verdict = "no interval"
        elif m.method == "single-value" and m.verdict == "unchanged":
            verdict = "same"
        sub = m.key.startswith("phase.") or (m.clock == "device" and m.label.startswith(" "))
        out.append({"metric": m.label.strip() if not sub else f"· {m.label.strip()}",
                    "key": m.key, "base": fmt_value(m.a, m.unit), "new": fmt_value(m.b, m.unit),
                    "change": _change(m), "ci": _ci(m, c), "threshold": _threshold(m),
                    "verdict": verdict})
    return out


def status_line(c: Comparison) -> str:
    if c.unjudged and not c.regressions:
        return "NOT JUDGED: " + c.unjudged
    if c.regressions:
        names = ", ".join(m.label.strip() for m in c.regressions)
        return f"REGRESSION: {names} significantly worse than the threshold allows"
    worse = [m for m in c.metrics if m.verdict == "worse" and m.gated]
    if worse:
        return "OK: no significant regression beyond the thresholds (" + ", ".join(
            m.label.strip() for m in worse) + " significantly worse, within the threshold)"
    return "OK: no significant regression beyond the thresholds"


def _sides(c: Comparison) -> str:
    def side(s):
        steps = "steady evaluation steps" if s[0].kind == "evaluation" else "steady steps"
        if len(s) == 1:
            x = s[0]
            return f"{x.source} ({x.steady} {steps} of {x.steps_total})"
        return f"{len(s)} runs ({sum(x.steady for x in s)} {steps})"
    return f"base: {side(c.base)}\nnew:  {side(c.new)}"


def _excluded(c: Comparison) -> str:
    w = sum(s.excluded.get("warmup", 0) for s in c.base + c.new)
    i = sum(s.excluded.get("instrumented", 0) for s in c.base + c.new)
    return (f"excluded on both sides alike: {w} warm-up step(s) (the first, and slow ones among the first "
            f"10%, per run) and {i} instrumented step(s) (FLOP counting, memory replay)")


# ---- text -----------------------------------------------------------------------------------------

def render_text(c: Comparison, console) -> None:
    from rich.table import Table
    from rich.text import Text

    console.print(Text("diag compare", style="bold"))
    console.print(Text(_sides(c)))
    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    for col in ("metric", "base", "new", "change", f"{int(c.confidence * 100)}% CI", "threshold", "verdict"):
        table.add_column(col, justify="right" if col not in ("metric", "verdict") else "left")
    style = {"REGRESSION": "bold red", "better": "green", "worse, within threshold": "yellow", "worse": "yellow"}
    for r in rows(c):
        table.add_row(r["metric"], r["base"], r["new"], r["change"], r["ci"], r["threshold"],
                      Text(r["verdict"], style=style.get(r["verdict"], "")))
    console.print(table)
    console.print(Text(c.headline, style="bold"))
    _text_findings(c, console)
    for d in c.differences:
        mark = "forced past: " if d["fact"] in c.forced else "differs: "
        console.print(Text(f"{mark}{d['fact']}: {d['base']} -> {d['new']}", style="dim" if not d["blocking"] else "yellow"))
    for note in c.notes:
        console.print(Text(f"note: {note}", style="dim"))
    console.print(Text(_excluded(c), style="dim"))
    console.print(Text(status_line(c), style="bold red" if c.regressions else
                       ("bold yellow" if c.unjudged else "bold green")))


def _text_findings(c: Comparison, console) -> None:
    from rich.text import Text

    f = c.findings
    for item in f["new"]:
        where = f" at {item['location']}" if item.get("location") else ""
        console.print(Text(f"new finding: {item['severity']} {item['id']}{where}: {item['message']}"))
    for item in f["gone"]:
        console.print(Text(f"gone: {item['severity']} {item['id']}", style="green"))
    for item in f["changed"]:
        console.print(Text(f"severity changed: {item['id']} {item['severity_before']} -> {item['severity']}"))


# ---- json -----------------------------------------------------------------------------------------

def render_json(c: Comparison) -> str:
    return json.dumps(c.to_dict(), indent=2, default=str)


# ---- markdown -------------------------------------------------------------------------------------

def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(c: Comparison) -> str:
    mark = "❌" if c.regressions else "✅"
    title = ("regression" if c.regressions else "not enough runs to judge" if c.unjudged
             else "no significant regression")
    mark = mark if c.regressions or not c.unjudged else "⚠️"
    lines = [f"### {mark} diag compare: {title}", "", f"**{_md(c.headline)}**", ""]
    lines += [f"> {_md(n)}" for n in c.notes] + ([""] if c.notes else [])
    lines.append(f"| metric | base | new | change | {int(c.confidence * 100)}% CI | threshold | verdict |")
    lines.append("|---|---:|---:|---:|---:|---:|---|")
    for r in rows(c):
        lines.append("| " + " | ".join(_md(r[k]) for k in ("metric", "base", "new", "change", "ci",
                                                             "threshold", "verdict")) + " |")
    f = c.findings
    if f["new"] or f["gone"] or f["changed"]:
        lines += ["", "**Findings**", ""]
        for item in f["new"]:
            where = f" (`{item['location']}`)" if item.get("location") else ""
            lines.append(f"- new: **{item['severity']}** `{item['id']}`{where}: {_md(item['message'] or '')}")
        for item in f["gone"]:
            lines.append(f"- gone: {item['severity']} `{item['id']}`")
        for item in f["changed"]:
            lines.append(f"- changed: `{item['id']}` {item['severity_before']} → {item['severity']}")
    diffs = [d for d in c.differences]
    if diffs:
        lines += ["", "<details><summary>what differs between the runs</summary>", ""]
        for d in diffs:
            lines.append(f"- {d['fact']}: `{d['base']}` → `{d['new']}`" + (" (forced)" if d["fact"] in c.forced else ""))
        lines += ["", "</details>"]
    lines += ["", f"<sub>{_md(_sides(c))} · {_md(_excluded(c))}</sub>", ""]
    return "\n".join(lines)


def parse_markdown_table(text: str) -> list[dict[str, str]]:
    """Read the metric table back (used by tests and by anyone scraping a PR comment)."""
    out = []
    header = None
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [x.strip().replace("\\|", "|") for x in line.strip().strip("|").split(" | ")]
        if header is None:
            header = cells
            continue
        if set("".join(cells)) <= set("-:|"):
            continue
        out.append(dict(zip(header, cells)))
    return out


# ---- junit ----------------------------------------------------------------------------------------

def render_junit(c: Comparison) -> str:
    suites = ET.Element("testsuites", name="diag compare")
    suite = ET.SubElement(suites, "testsuite", name="diag compare", tests=str(len(c.metrics)))
    failures = skipped = 0
    for r, m in zip(rows(c), c.metrics):
        case = ET.SubElement(suite, "testcase", classname="diag.compare", name=m.key, time="0")
        detail = (f"{r['metric']}: {r['base']} -> {r['new']} ({r['change']}, "
                  f"{int(c.confidence * 100)}% CI {r['ci']}, threshold {r['threshold'] or 'none'})")
        if m.verdict == "regression" and m.gated:
            failures += 1
            msg = detail
            if m.key == "step_time" and c.attribution:
                msg += "; " + c.headline
            ET.SubElement(case, "failure", message=msg, type="regression").text = c.headline
        elif m.verdict == "unknown":
            skipped += 1
            ET.SubElement(case, "skipped", message=m.note or "not compared")
        else:
            ET.SubElement(case, "system-out").text = f"{r['verdict']}: {detail}"
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    suites.set("tests", str(len(c.metrics)))
    suites.set("failures", str(failures))
    suites.set("errors", "0")
    return ET.tostring(suites, encoding="unicode")


# ---- GitHub Actions ---------------------------------------------------------------------------------

def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_prop(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def render_annotations(c: Comparison) -> str:
    """Workflow commands (``::error ...``) for a GitHub Actions log: one per regression, a warning
    per new error/warning finding, a notice for the verdict."""
    out = []
    for m in c.regressions:
        r = next(x for x in rows(c) if x["key"] == m.key)
        text = f"{r['metric']} {r['change']} ({int(c.confidence * 100)}% CI {r['ci']}), threshold {r['threshold']}"
        if m.key == "step_time":
            text = c.headline + f", threshold {r['threshold']}"
        out.append(f"::error title={_escape_prop('diag compare: ' + m.label.strip())}::{_escape_data(text)}")
    for item in c.findings["new"]:
        if item["severity"] not in ("error", "warning", "crashed"):
            continue
        loc = item.get("location")
        file_part = ""
        if loc:
            f, _, line = loc.partition(":")
            file_part = f"file={_escape_prop(f)}," + (f"line={line}," if line.isdigit() else "")
        out.append(f"::warning {file_part}title={_escape_prop('new finding ' + item['id'])}::"
                   f"{_escape_data(item['message'] or item['id'])}")
    out.append(f"::notice title=diag compare::{_escape_data(status_line(c) + ' — ' + c.headline)}")
    return "\n".join(out)
