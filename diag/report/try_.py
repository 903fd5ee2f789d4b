"""``diag try``'s output: text (a table, the fix for each winner in the run's framework words, a
one-line summary), JSON (the schema in docs/try.md) and markdown. Renders a
:class:`diag.trial.engine.TryResult`; judges nothing."""
from __future__ import annotations

import json
from typing import Any

from diag.knobs import FRAMEWORK_NAMES, KNOBS, words

SCHEMA_VERSION = 1


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _speed(t: dict) -> str:
    if t.get("speedup") is None:
        return "-"
    if t.get("ci_low") is None or t.get("ci_high") is None:
        return f"{t['speedup']:.2f}x"
    return f"{t['speedup']:.2f}x ({t['ci_low']:.2f}-{t['ci_high']:.2f})"


def _rate(t: dict) -> str:
    v, b = t.get("samples_per_s"), t.get("baseline_samples_per_s")
    if v is None:
        return "-"
    return f"{v:,.0f}/s" + (f" (was {b:,.0f})" if b else "")


def _mem(t: dict) -> str:
    v, b = t.get("peak_memory"), t.get("baseline_peak_memory")
    if not v:
        return "n/a"
    s = f"{v / 2**20:,.0f} MiB"
    return s + (f" (was {b / 2**20:,.0f})" if b else "")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.1f} ms"


# the table's cells, shared by the text, HTML and TUI renderings of the trials
speed_cell, rate_cell, memory_cell, ms_cell = _speed, _rate, _mem, _ms


def fixes(data: dict) -> list[tuple[str, str, str | None]]:
    """(knob spec, the fix in the run's framework words, the snippet) for each knob found faster."""
    fw = data.get("framework")
    out = []
    seen = set()
    for t in data.get("trials") or []:
        if t.get("verdict") != "faster" or t.get("kind") == "combined":
            continue
        for spec in t.get("knobs") or []:
            kid, _, val = spec.strip().partition("=")
            if kid not in KNOBS or kid in seen:
                continue
            seen.add(kid)
            values: dict[str, Any] = {"cls": "AdamW", "better": "fused=True", "dtype": "bfloat16",
                                      **(data.get("values") or {})}
            if val:
                values["n"] = val
            fix, snippet, _lever = words(kid, fw, **values)
            out.append((spec, fix, snippet))
    return out


def render_json(result) -> str:
    data = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    data = {"schema_version": SCHEMA_VERSION, **data}
    data["fixes"] = [{"knob": k, "fix": f, "snippet": s} for k, f, s in fixes(data)]
    return json.dumps(data, indent=2, default=str) + "\n"


def _rows(data: dict) -> list[list[str]]:
    rows = []
    for t in data.get("trials") or []:
        rows.append([t["knob"] + (" (combined)" if t.get("kind") == "combined" else ""), _speed(t),
                     _ms(t.get("step_s")), _rate(t), _mem(t), t.get("verdict", ""), str(t.get("steps") or 0)])
    for n in data.get("not_tried") or []:
        rows.append([n["knob"], "-", "-", "-", "-", n["verdict"], "0"])
    return rows


HEAD = ["knob", "speed-up (95% CI)", "step", "samples/s", "peak memory", "verdict", "steps"]


def render_text(result) -> str:
    data = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    lines = []
    b = data.get("baseline") or {}
    fw = data.get("framework")
    lines.append(f"diag try: {data.get('script')} ({FRAMEWORK_NAMES.get(fw or 'torch', 'plain PyTorch')}, "
                 f"{data.get('device', 'cpu')})")
    runs = data.get("runs") or []
    clock = "the device clock (CUDA events)" if runs and all(r.get("clock") == "device" for r in runs) else \
        "the wall clock"
    if b.get("median_step_s"):
        lines.append(f"baseline: median step {_ms(b['median_step_s'])} over {b.get('steps')} steps; step times "
                     f"on {clock}")
    rows = _rows(data)
    if rows:
        widths = [max(len(HEAD[i]), *(len(r[i]) for r in rows)) for i in range(len(HEAD))]
        lines.append("")
        lines.append("  ".join(h.ljust(w) for h, w in zip(HEAD, widths)).rstrip())
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        lines.append("")
    for t in data.get("trials") or []:
        why = t.get("why")
        if why:
            lines.append(f"  {t['knob']}: {why}")
            if t.get("applied") and t.get("verdict") != "not applicable":
                lines.append(f"      applied: {t['applied']}")
    for n in data.get("not_tried") or []:
        lines.append(f"  {n['knob']}: {n['verdict']}: {n['why']}")
    fx = fixes(data)
    if fx:
        lines.append("")
        lines.append(f"the fix, in {FRAMEWORK_NAMES.get(fw or 'torch', 'plain PyTorch')}'s words:")
        for spec, fix, snippet in fx:
            lines.append(f"  {spec}: {fix}")
            for ln in (snippet or "").splitlines():
                lines.append(f"      {ln}")
    for n in data.get("notes") or []:
        lines.append(f"note: {n}")
    lines.append("")
    lines.append(f"summary: {data.get('summary')}")
    lines.append(f"({len(data.get('runs') or [])} run(s) in {data.get('elapsed_s', 0):.0f} s of a "
                 f"{data.get('budget_s', 0):.0f} s budget; run directories under {data.get('directory')})")
    return "\n".join(lines) + "\n"


def render_markdown(result) -> str:
    data = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    fw = data.get("framework")
    out = [f"## diag try: `{data.get('script')}`", "",
           f"{FRAMEWORK_NAMES.get(fw or 'torch', 'plain PyTorch')}, {data.get('device', 'cpu')}; "
           f"baseline median step {_ms((data.get('baseline') or {}).get('median_step_s'))}.", "",
           "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    for r in _rows(data):
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    out.append("")
    for t in data.get("trials") or []:
        if t.get("why"):
            out.append(f"- **{t['knob']}**: {t['why']}")
    for n in data.get("not_tried") or []:
        out.append(f"- **{n['knob']}**: {n['verdict']}: {n['why']}")
    fx = fixes(data)
    if fx:
        out += ["", "### The fix"]
        for spec, fix, snippet in fx:
            out.append(f"- `{spec}`: {fix}")
            if snippet:
                out += ["", "```python", snippet, "```"]
    out += ["", f"**Summary**: {data.get('summary')}", ""]
    return "\n".join(out)


def render_html(result) -> str:
    """One self-contained page with the what-if section (diag/report/try_html.py)."""
    from diag.report.try_html import render_html as _page

    return _page(result)


def render(result, fmt: str) -> str:
    return {"text": render_text, "json": render_json, "markdown": render_markdown,
            "html": render_html}[fmt](result)


def render_list(rows: list[dict]) -> str:
    w = max(len(r["knob"]) for r in rows)
    lines = [f"{'knob'.ljust(w)}  {'how':7}  what diag try does"]
    for r in rows:
        lines.append(f"{r['knob'].ljust(w)}  {r['mode']:7}  {r['how']}")
    lines.append("")
    lines.append("switch: turned on and off in blocks of steps of one process; restart: runs of its own, "
                 "alternated with the baseline's; none: not applied from outside (why given)")
    return "\n".join(lines) + "\n"
