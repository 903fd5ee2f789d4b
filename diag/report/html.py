"""The HTML report (``diag check --format html``): one self-contained file, made from Evidence and
findings only (so ``diag check --from`` writes the same file).

Everything is inline: the CSS, the charts' JavaScript (Chart.js, vendored in
``diag/report/html_assets/``, MIT) and the data (one JSON island). No network, no external font. The
text parts (header, findings, tables) are plain HTML and read with JavaScript off; the charts are
drawn from the JSON island when JavaScript runs.

Safe by construction: every string that came from the evidence, the findings or the script goes
through :func:`esc` (HTML text and attributes) or :func:`json_island` (``<``, ``>``, ``&``, U+2028
and U+2029 escaped, so ``</script>`` cannot end the island); links are kept only for http(s) URLs.

Reusable pieces (for another renderer, e.g. ``diag compare --format html``): :func:`esc`,
:func:`json_island`, :func:`page` (the document shell with the CSS, Chart.js, the chart helpers in
``diag.charts`` and the render-status protocol), :func:`chart` (a chart's figure element),
:func:`table`, :func:`downsample`.

Imports: diag.cost and diag.memory (estimates, the memory plan), never diag.tui or diag.probe; no
torch, no textual.
"""
from __future__ import annotations

import base64
import hashlib
import html as _html
import json
import math
import re
from importlib import resources
from typing import Any, Iterable, Sequence

from diag import __version__, units
from diag.evidence import phases as _ph
from diag.findings import Severity, count_phrase, sort_findings
from diag.report import fmt_value

# long series are cut into at most this many buckets (min / median / max per bucket)
MAX_POINTS = 600
HIST_BINS = 40
# the host-clock phases of a step, in stacking order; "h2d_s" is drawn when the evidence has it
# (from the one definition, diag.evidence.phases: the training phases with the evaluation step's H2D
# after data and DDP's collective wait before other)
PHASES = ((_ph.DATA.field, _ph.DATA.label), (_ph.H2D.field, _ph.H2D.label),
          *((p.field, p.label) for p in _ph.TRAINING if p not in (_ph.DATA, _ph.OTHER)),
          (_ph.COMM.field, _ph.COMM.label), (_ph.OTHER.field, _ph.OTHER.label))
# Device-clock phases (the GPU timeline): a step carries them as ``extra["device_phases"]`` (or an
# attribute ``device_phases``): {phase name: seconds}. When any kept step has them, a second timeline
# is drawn; see :func:`device_phases`.
DEVICE_PHASES_KEY = "device_phases"
MEM_CATEGORIES = (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer"),
                  ("activations", "activations"), ("other", "other"))
SEVERITY_ORDER = (Severity.CRASHED, Severity.ERROR, Severity.WARNING, Severity.INFO, Severity.PASS,
                  Severity.SKIPPED)


# ---- escaping -------------------------------------------------------------------------------------

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def esc(value: Any) -> str:
    """HTML-escape any value for text or a quoted attribute (``& < > " '``)."""
    text = _html.escape("" if value is None else str(value), quote=True)
    # control characters from evidence (an ESC, a NUL) are shown escaped, never kept raw in the page
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if _CONTROL.search(text) else text


_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_JSON_RE = re.compile("[<>&\u2028\u2029]")


def _finite(obj: Any) -> Any:
    """NaN and infinities become null (JSON has no spelling for them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def json_island(data: Any) -> str:
    """JSON safe to embed in ``<script type="application/json">``: nothing in it can close the
    element or start a comment, whatever the strings hold."""
    text = json.dumps(_finite(data), separators=(",", ":"), allow_nan=False, default=str, ensure_ascii=False)
    return _JSON_RE.sub(lambda m: _JSON_ESCAPES[m.group(0)], text)


def safe_url(url: Any) -> str | None:
    """The URL when it is http(s), else None (a ``javascript:`` link is never made)."""
    if not isinstance(url, str):
        return None
    u = url.strip()
    return u if re.match(r"^https?://", u, re.IGNORECASE) else None


# ---- formatting -----------------------------------------------------------------------------------

def ms(seconds: float | None) -> str:
    if seconds is None:
        return "N/A"
    v = seconds * 1000
    return f"{v:.1f} ms" if v >= 1 else f"{v:.3f} ms"


def fmt_bytes(n: Any) -> str:
    if n is None or not isinstance(n, (int, float)) or isinstance(n, bool):
        return "N/A"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _median(values: Sequence[float]) -> float | None:
    v = sorted(values)
    if not v:
        return None
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


# ---- series -------------------------------------------------------------------------------------------

def downsample(xs: Sequence[float], ys: Sequence[float | None], max_points: int = MAX_POINTS) -> dict[str, list]:
    """At most ``max_points`` buckets of consecutive points: x of the bucket's first point, and the
    min, median and max of its y values (None where a bucket has none). Short series come back whole
    (min = median = max)."""
    n = len(xs)
    if n <= max_points:
        ys_l = [_num(y) for y in ys]
        return {"x": list(xs), "min": ys_l, "med": ys_l, "max": ys_l, "bucket": 1}
    size = math.ceil(n / max_points)
    out: dict[str, list] = {"x": [], "min": [], "med": [], "max": []}
    for i in range(0, n, size):
        vals = [v for v in (_num(y) for y in ys[i:i + size]) if v is not None]
        out["x"].append(xs[i])
        out["min"].append(min(vals) if vals else None)
        out["med"].append(_median(vals) if vals else None)
        out["max"].append(max(vals) if vals else None)
    out["bucket"] = size
    return out


def _round(values: Iterable[Any], digits: int = 6) -> list:
    return [round(v, digits) if isinstance(v, float) else v for v in values]


def device_phases(step) -> dict[str, float] | None:
    """The device-clock phases of a step (the GPU timeline), when the evidence has them:
    ``step.device_phases`` or ``step.extra["device_phases"]``, a {phase: seconds} dict."""
    v = getattr(step, DEVICE_PHASES_KEY, None)
    if v is None and isinstance(getattr(step, "extra", None), dict):
        v = step.extra.get(DEVICE_PHASES_KEY)
    if isinstance(v, dict):
        out = {str(k): float(x) for k, x in v.items() if _num(x) is not None}
        return out or None
    return None


def _step_series(rank) -> dict[str, Any] | None:
    """Per-step phases of a rank's timed steps (warm-up and instrumented steps left out), bucketed."""
    steps = rank.timed_steps()
    if not steps:
        return None
    def value(s, key):
        if key == "comm_s":       # DDP's collective wait: a phase of its own (extra.comm_wait_s)
            return float((s.extra or {}).get("comm_wait_s") or 0.0)
        return getattr(s, key, None) or 0.0

    phases = [(k, label) for k, label in PHASES
              if k not in ("h2d_s", "comm_s") or any(_num(value(s, k)) for s in steps)]
    xs = [s.index for s in steps]
    out: dict[str, Any] = {"rank": rank.rank, "phases": [label for _, label in phases], "series": {},
                           "clock": "host"}
    total = downsample(xs, [s.total_s for s in steps])
    out["x"] = total["x"]
    out["bucket"] = total["bucket"]
    out["total"] = {k: _round(total[k]) for k in ("min", "med", "max")}
    for key, label in phases:
        d = downsample(xs, [value(s, key) for s in steps])
        out["series"][label] = _round(d["med"])
    dev = [device_phases(s) for s in steps]
    if any(dev):
        names: list[str] = []
        for d in dev:
            for k in d or {}:
                if k not in names:
                    names.append(k)
        out["device"] = {"phases": names,
                         "series": {n: _round(downsample(xs, [(d or {}).get(n) for d in dev])["med"])
                                    for n in names}}
    return out


def _histogram(values: list[float], bins: int = HIST_BINS) -> dict[str, Any] | None:
    if not values:
        return None
    lo, hi = min(values), max(values)
    if hi <= lo:
        return {"edges": [lo, lo], "counts": [len(values)]}
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - lo) / width))] += 1
    return {"edges": _round([lo + i * width for i in range(bins + 1)], 7), "counts": counts}


# ---- the numbers of the header (the same as the JSON report's) ---------------------------------------

def _throughput(evidence) -> tuple[float | None, str]:
    total = 0.0
    unit = "samples"
    any_tokens = any(s.tokens for r in evidence.ranks for s in r.timed_steps())
    if any_tokens:
        unit = "tokens"
    seen = False
    for r in evidence.ranks:
        steps = [s for s in r.timed_steps() if (s.tokens if any_tokens else s.samples)]
        t = sum(s.total_s for s in steps)
        if steps and t > 0:
            total += sum((s.tokens if any_tokens else s.samples) or 0 for s in steps) / t
            seen = True
    return (total if seen else None), unit


def _gpu_summary(evidence) -> tuple[str, list[str]]:
    g = evidence.gpu
    devices = g.devices or []
    names = [str(d.get("name") or "GPU") for d in devices if isinstance(d, dict)]
    if not names:
        names = [d.name for d in evidence.environment.devices]
    if not names:
        return "none", []
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{c} × {n}" for n, c in counts.items()), names


def header_facts(evidence, findings, exit_code: int) -> dict[str, Any]:
    """The run at a glance (the numbers come from the same functions as the JSON report's summary)."""
    from diag.report.json import summary

    s = summary(evidence, findings)
    run = evidence.run
    thr, unit = _throughput(evidence)
    gpus, _ = _gpu_summary(evidence)
    steps, med = s["steps"], s["step_time_median_s"]
    ev = s.get("evaluation")
    if s.get("kind") == "evaluation" and ev:
        # an evaluation-only run: its steps are evaluation steps (one forward on one batch)
        steps, med = ev["steps"], ev.get("median_step_s")
        if ev.get("tokens_per_s"):
            thr, unit = ev["tokens_per_s"], "tokens"
        elif ev.get("samples_per_s"):
            thr, unit = ev["samples_per_s"], "samples"
    return {
        "kind": s.get("kind"),
        "script": run.script, "args": list(run.args), "status": run.status, "stop_reason": run.stop_reason,
        "exit_code": exit_code, "steps": steps, "step_time_median_s": med,
        "ranks": s["ranks"], "throughput": thr, "throughput_unit": unit, "gpus": gpus,
        "wall_s": run.wall_s, "simulated": simulated_label(evidence), "counts": s["counts"],
        "run_id": run.id, "launcher": run.launcher,
        "probe": s.get("probe"),   # diag's probe's own share of the median step (docs/performance.md)
    }


def simulated_label(evidence) -> str | None:
    """The scenario name when GPU values are simulated ("simulated" when unnamed), else None."""
    if evidence.run.simulated_gpus:
        return str(evidence.run.simulated_gpus)
    if evidence.gpu.simulated:
        return str(evidence.gpu.scenario or "simulated")
    return None


# ---- HTML pieces ---------------------------------------------------------------------------------------

def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], cls: str = "",
          row_classes: Sequence[str] | None = None) -> str:
    """A table; every cell is escaped (pass :class:`Raw` for markup made here)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for i, row in enumerate(rows):
        rc = row_classes[i] if row_classes and i < len(row_classes) else ""
        cells = "".join(f"<td>{c.html if isinstance(c, Raw) else esc(c)}</td>" for c in row)
        body.append(f'<tr class="{esc(rc)}">{cells}</tr>' if rc else f"<tr>{cells}</tr>")
    return (f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


class Raw:
    """Markup made by this module (already escaped)."""
    __slots__ = ("html",)

    def __init__(self, html: str):
        self.html = html


def chart(chart_id: str, title: str, caption: str = "", height: int = 260) -> str:
    """A chart's figure: a titled canvas the page script fills from the data island's entry
    ``charts[chart_id]`` (see ``diag.charts`` in report.js); a note shows without JavaScript."""
    cid = esc(chart_id)
    cap = f'<figcaption>{esc(caption)}</figcaption>' if caption else ""
    return (f'<figure class="chart" id="fig-{cid}"><h3>{esc(title)}</h3>'
            f'<div class="canvas" style="height:{int(height)}px"><canvas id="chart-{cid}" '
            f'data-chart="{cid}" role="img" aria-label="{esc(title)}"></canvas>'
            f'<noscript><p class="muted">Chart: needs JavaScript (the numbers are in the tables).</p></noscript>'
            f'</div>{cap}</figure>')


def _asset(name: str) -> str:
    return resources.files("diag.report").joinpath("html_assets", name).read_text(encoding="utf-8")


def _chartjs() -> str:
    js = _asset("chart.umd.min.js")
    # no source-map fetch, and nothing in the library may end the inline element
    js = re.sub(r"//# sourceMappingURL=\S*\s*$", "", js)
    if "</script" in js.lower():
        raise RuntimeError("the vendored chart library contains '</script': it cannot be inlined")
    return js


def page(title: str, body: str, data: dict[str, Any], *, simulated: str | None = None,
         generator: str | None = None) -> str:
    """The whole document: ``body`` (markup made with :func:`esc`) and ``data`` (a dict whose
    ``charts`` entry maps chart ids to chart specs, see report.js) inside the shell with the CSS, the
    vendored Chart.js, the chart helpers and the error/render-status protocol: ``<body>`` gets
    ``data-rendered="ok"`` once every chart is drawn, or ``"error"`` with the messages in
    ``#diag-errors``. The page's content security policy allows only these three scripts (by hash)
    and no network at all."""
    template = _asset("page.html")
    scripts = {"errjs": _asset("errors.js"), "chartjs": _chartjs(), "app": _asset("report.js")}
    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(js.encode()).digest()).decode()}'"
                      for js in scripts.values())
    parts = {
        "title": esc(title),
        "css": _asset("report.css"),
        "body": body,
        "data": json_island(data),
        "scripthashes": hashes,
        **scripts,
        "generator": esc(generator or f"diag {__version__}"),
        "simclass": "simulated" if simulated else "",
    }
    return re.sub(r"@@(\w+)@@", lambda m: parts[m.group(1)], template)


# ---- sections -----------------------------------------------------------------------------------------

def _header(evidence, facts: dict[str, Any]) -> str:
    run = evidence.run
    status_cls = {"completed": "ok", "stopped": "ok", "timeout": "warn"}.get(run.status, "bad")
    script = " ".join([str(facts["script"] or "(in-process run)")] + [str(a) for a in facts["args"]])
    stop = f' <span class="muted">({esc(run.stop_reason)})</span>' if run.stop_reason else ""
    med = facts["step_time_median_s"]
    thr = facts["throughput"]
    evaluation = facts.get("kind") == "evaluation"
    tiles = [
        ("status", Raw(f'<span class="status {status_cls}">{esc(run.status)}</span>{stop}')),
        ("evaluation steps" if evaluation else "steps", f"{facts['steps']:,}"),
        ("median evaluation step" if evaluation else "median step", ms(med) if med is not None else "N/A"),
        ("throughput", f"{thr:,.1f} {facts['throughput_unit']}/s" if thr is not None else "N/A"),
        ("GPUs", facts["gpus"]),
        ("wall time", f"{run.wall_s:.1f} s" if run.wall_s is not None else "N/A"),
    ]
    if facts["ranks"] > 1:
        tiles.append(("ranks", str(facts["ranks"])))
    own = facts.get("probe")
    if own:
        from diag.evidence import probe as probe_cost

        warn = ' class="status warn"' if own["median_step_share"] > probe_cost.WARN_SHARE else ""
        tiles.append(("diag's probe", Raw(f'<span{warn} title="{esc(probe_cost.headline(own))}">'
                                          f'{esc(probe_cost.pct(own["median_step_share"]))} of the step</span>')))
    tiles_html = "".join(
        f'<div class="tile"><div class="k">{esc(k)}</div><div class="v" data-fact="{esc(k)}">'
        f'{v.html if isinstance(v, Raw) else esc(v)}</div></div>' for k, v in tiles)
    sim = ""
    if facts["simulated"]:
        sim = (f'<div class="banner sim" id="simulated">SIMULATED GPUs: every GPU value in this report comes '
               f'from the simulated scenario “{esc(facts["simulated"])}”, not from real hardware.</div>')
    counts = facts["counts"]
    badges = "".join(
        f'<span class="badge sev-{s.value}">{esc(count_phrase(s, counts[s.value]))}</span>'
        for s in SEVERITY_ORDER if counts.get(s.value))
    notes = "".join(f"<li>{esc(n)}</li>" for n in evidence.notes)
    notes_html = f'<ul class="notes">{notes}</ul>' if notes else ""
    rid = f'<span class="muted">run {esc(run.id)}</span>' if run.id else ""
    return (f'<header id="summary"><h1>diag report <span class="script" id="script">{esc(script)}</span></h1>'
            f'{sim}<div class="tiles">{tiles_html}</div><div class="badges">{badges} {rid}</div>'
            f'{notes_html}</header>')


def _finding_html(f) -> str:
    sev = f.severity.value
    parts = [f'<p class="msg">{esc(f.message)}</p>']
    nums = {k: v for k, v in f.evidence.items() if k not in ("traceback", "message") and v is not None
            and not isinstance(v, (dict, list))}
    if nums:
        cells = "".join(f'<span class="num"><span class="nk">{esc(k)}</span> {esc(fmt_value(v))}</span>'
                        for k, v in nums.items())
        parts.append(f'<div class="nums">{cells}</div>')
    if f.why:
        parts.append(f'<p><b>why:</b> {esc(f.why)}</p>')
    if f.fix:
        parts.append(f'<p class="fix"><b>fix:</b> {esc(f.fix)}</p>')
    if f.snippet:
        parts.append(f'<pre class="snippet"><code>{esc(f.snippet)}</code></pre>')
    tb = f.evidence.get("traceback")
    if isinstance(tb, str) and tb:
        parts.append(f'<details><summary>traceback</summary><pre>{esc(tb)}</pre></details>')
    if f.location:
        parts.append(f'<p class="loc"><b>at:</b> <code>{esc(str(f.location))}</code></p>')
    url = safe_url(f.docs)
    if url:
        parts.append(f'<p class="docs"><a href="{esc(url)}" rel="noopener noreferrer">{esc(url)}</a></p>')
    elif f.docs:
        parts.append(f'<p class="docs muted">{esc(f.docs)}</p>')
    return (f'<article class="finding sev-{esc(sev)}" data-id="{esc(f.id)}" data-severity="{esc(sev)}">'
            f'<h3><span class="badge sev-{esc(sev)}">{esc(sev.upper())}</span> <code>{esc(f.id)}</code> '
            f'— {esc(f.title)}</h3>{"".join(parts)}</article>')


def _findings(findings) -> str:
    findings = sort_findings(findings)
    shown = [f for f in findings if f.severity.rank >= Severity.INFO.rank]
    rest = [f for f in findings if f.severity in (Severity.PASS, Severity.SKIPPED)]
    out = ['<section id="findings"><h2>Findings</h2>']
    if not shown:
        out.append('<p class="muted">No error, warning or info finding.</p>')
    for f in shown:
        out.append(_finding_html(f))
    if rest:
        rows = [(Raw(f'<span class="badge sev-{esc(f.severity.value)}">{esc(f.severity.value.upper())}</span>'),
                 Raw(f"<code>{esc(f.id)}</code>"), f.message) for f in rest]
        out.append(f'<details class="rest"><summary>{len(rest)} passed or skipped check(s)</summary>'
                   f'{table(("", "check", "message"), rows, cls="rest")}</details>')
    out.append("</section>")
    return "".join(out)


def _straggler(findings) -> int | None:
    for f in findings:
        if f.id == "distributed.straggler" and f.severity in (Severity.WARNING, Severity.ERROR):
            r = f.evidence.get("rank")
            if isinstance(r, int) and not isinstance(r, bool):
                return r
    return None


def _steps_section(evidence, findings, charts: dict[str, Any]) -> str:
    if not evidence.ranks or not any(r.steps for r in evidence.ranks):
        if evidence.ranks and evidence.primary.eval_steps and evidence.primary.run_kind() == "evaluation":
            return _eval_steps_section(evidence.primary, charts)
        return ('<section id="steps"><h2>Steps</h2><p class="muted">No training step was observed.</p>'
                '</section>')
    primary = evidence.primary
    straggler = _straggler(findings)
    out = ['<section id="steps"><h2>Steps</h2>']
    from diag.evidence import probe as probe_cost

    sampling = probe_cost.sampling_line(primary)
    if sampling:      # the probe's cost budget sampled its per-step extras (docs/performance.md)
        out.append(f'<p class="muted" id="probe-sampling">{esc(sampling)}.</p>')
    shown = [primary]
    if straggler is not None and straggler != primary.rank:
        shown += [r for r in evidence.ranks if r.rank == straggler]
    for r in shown:
        s = _step_series(r)
        if s is None:
            continue
        key = f"steps-r{r.rank}"
        charts[key] = {"type": "steps", **s}
        who = f"rank {r.rank}" + (" — the straggler" if r.rank == straggler else "")
        cap = "Timed steps (the warm-up steps and FLOP-counted steps left out: docs/steps.md); host clock."
        if s["bucket"] > 1:
            cap += (f" {len(r.timed_steps()):,} steps in buckets of {s['bucket']}: each bar is the bucket's "
                    "median per phase, the lines its min and max step time.")
        out.append(chart(key, f"Step time by phase ({who})", cap, height=300))
        if "device" in s:
            dkey = f"device-r{r.rank}"
            charts[dkey] = {"type": "stack", "x": s["x"], "phases": s["device"]["phases"],
                            "series": s["device"]["series"], "unit": "s"}
            out.append(chart(dkey, f"GPU time per step by phase, device clock ({who})",
                             "CUDA-event phase times, as the GPU ran them.", height=260))
    steps = primary.timed_steps()
    hist = _histogram([s.total_s for s in steps])
    med = primary.median_step()
    row = []
    if med:
        rows = [(label, ms(med.get(key)), f"{(med.get(key) or 0) / med['total_s']:.0%}" if med["total_s"] else "")
                for key, label in PHASES if key in med]
        rows.append(("step", ms(med["total_s"]), "100%"))
        row.append(f'<div><h3>Median step (rank {primary.rank}, {med["n"]} timed steps)</h3>'
                   + table(("phase", "median", "share"), rows, cls="phases") + "</div>")
    if hist:
        charts["hist"] = {"type": "hist", **hist}
        row.append(chart("hist", f"Distribution of step times (rank {primary.rank})",
                         f"{len(steps):,} timed steps in {len(hist['counts'])} bin{'s' if len(hist['counts']) != 1 else ''}.", height=220))
    if row:
        out.append('<div class="grid2">' + "".join(row) + "</div>")
    if evidence.multi_rank:
        out.append(_ranks_table(evidence, straggler, charts))
    out.append("</section>")
    return "".join(out)


def _eval_steps_section(rank, charts: dict[str, Any]) -> str:
    """An evaluation-only run: its evaluation steps (one forward on one batch, docs/steps.md section 5)
    as the Steps section: the median of each phase and the distribution of step times."""
    tp = rank.eval_throughput() or {}
    med = tp.get("phases") or {}
    out = ['<section id="steps"><h2>Evaluation steps</h2>',
           f'<p class="muted">An evaluation run: {tp.get("steps", 0):,} evaluation step(s), no training step '
           '(each step is one forward on one batch; the warm-up steps and FLOP-counted ones left out of '
           'the medians).</p>']
    row = []
    total = med.get("total_s")
    if total:
        labels = tuple((p.field, "copy to device" if p is _ph.H2D else p.label) for p in _ph.EVALUATION)
        rows = [(label, ms(med.get(key)), f"{(med.get(key) or 0) / total:.0%}") for key, label in labels
                if key in med]
        rows.append(("evaluation step", ms(total), "100%"))
        row.append(f'<div><h3>Median evaluation step (rank {rank.rank})</h3>'
                   + table(("phase", "median", "share"), rows, cls="phases") + "</div>")
    steps = [s for s in rank.eval_steps if not s.instrumented]
    hist = _histogram([s.total_s for s in steps])
    if hist:
        charts["hist"] = {"type": "hist", **hist}
        row.append(chart("hist", f"Distribution of evaluation step times (rank {rank.rank})",
                         f"{len(steps):,} timed evaluation steps in {len(hist['counts'])} "
                         f"bin{'s' if len(hist['counts']) != 1 else ''}.", height=220))
    if row:
        out.append('<div class="grid2">' + "".join(row) + "</div>")
    out.append("</section>")
    return "".join(out)


def _ranks_table(evidence, straggler: int | None, charts: dict[str, Any]) -> str:
    rows, classes = [], []
    per_rank: dict[str, list] = {label: [] for _, label in PHASES if _ != "h2d_s"}
    labels = []
    for r in evidence.ranks:
        med = r.median_step()
        peak = None
        for rec in (r.memory.steps or [])[-2000:]:
            if isinstance(rec, dict) and _num(rec.get("peak")) is not None:
                peak = max(peak or 0, rec["peak"])
        mark = " ◀ straggler" if r.rank == straggler else ""
        rows.append((f"{r.rank}{mark}", r.host or "?", r.status, f"{r.step_stats.count:,}",
                     ms(med["total_s"]) if med else "N/A",
                     *[ms(med.get(k, 0.0)) if med else "N/A" for k, _ in PHASES if k != "h2d_s"],
                     fmt_bytes(peak)))
        classes.append("straggler" if r.rank == straggler else "")
        labels.append(f"rank {r.rank}")
        for k, label in PHASES:
            if k != "h2d_s":
                per_rank[label].append(round(med.get(k, 0.0), 6) if med else None)
    charts["ranks"] = {"type": "ranks", "labels": labels, "phases": list(per_rank), "series": per_rank,
                       "highlight": labels.index(f"rank {straggler}") if straggler is not None
                       and f"rank {straggler}" in labels else None}
    head = ("rank", "host", "status", "steps", "median step",
            *[label for k, label in PHASES if k != "h2d_s"], "peak memory")
    return ('<h3>Ranks</h3>' + table(head, rows, cls="ranks", row_classes=classes)
            + chart("ranks", "Median step by phase, per rank", "The straggler (when a check named one) is "
                    "outlined.", height=max(160, 28 * len(labels) + 60)))


def _gpu_section(evidence, charts: dict[str, Any]) -> str:
    g = evidence.gpu
    out = ['<section id="gpus"><h2>GPUs and host</h2>']
    devices = [d for d in (g.devices or []) if isinstance(d, dict)]
    sim = simulated_label(evidence)
    if sim:
        out.append(f'<p class="banner sim">SIMULATED values (scenario “{esc(sim)}”).</p>')
    if not devices:
        out.append(f'<p class="muted">No GPU telemetry: {esc(g.reason or "no device was sampled")}.</p>')
    else:
        rows = []
        util, mem = [], []
        for d in devices:
            st = d.get("stats") if isinstance(d.get("stats"), dict) else {}
            se = d.get("series") if isinstance(d.get("series"), dict) else {}
            total = _num(d.get("memory_total")) or _num(d.get("mem_total"))
            rows.append((d.get("index", "?"), d.get("name") or "GPU", "yes" if d.get("used_by_run") else
                         ("no" if d.get("used_by_run") is False else "?"),
                         _pct(st.get("util_mean")), _pct(st.get("util_max")),
                         fmt_bytes(st.get("mem_used_max")), fmt_bytes(total),
                         "LOST" if d.get("lost") else ""))
            t = [x for x in se.get("t") or []]
            if t:
                label = f"GPU {d.get('index', '?')}"
                u = downsample(t, se.get("util") or [None] * len(t))
                m = downsample(t, se.get("mem_used") or [None] * len(t))
                util.append({"label": label, "x": _round(u["x"], 3), "y": _round(u["med"], 2)})
                mem.append({"label": label, "x": _round(m["x"], 3), "y": _round(m["max"], 0),
                            "total": total})
            out.append(table(("GPU", "name", "used by the run", "util mean", "util max", "memory max", "memory total",
                          ""), rows, cls="gpus"))
        if util:
            charts["gpu-util"] = {"type": "lines", "lines": util, "unit": "%", "ymax": 100, "xlabel": "s"}
            charts["gpu-mem"] = {"type": "lines", "lines": mem, "unit": "bytes", "xlabel": "s"}
            out.append('<div class="grid2">'
                       + chart("gpu-util", "GPU utilisation per GPU (%)", "Seconds since the first sample.")
                       + chart("gpu-mem", "GPU memory used per GPU", "Bucket maximum.") + "</div>")
    host = g.host if isinstance(g.host, dict) else {}
    hs = host.get("series") if isinstance(host.get("series"), dict) else {}
    t = hs.get("t") or []
    if t:
        cpu = downsample(t, hs.get("cpu") or [None] * len(t))
        memu = downsample(t, hs.get("mem_used") or [None] * len(t))
        lines = [{"label": "whole host", "x": _round(cpu["x"], 3), "y": _round(cpu["med"], 2)}]
        own = _own_cpu_line(g, host.get("cpu_count"))
        if own is not None:
            lines.insert(0, own)
        charts["host-cpu"] = {"type": "lines", "unit": "%", "xlabel": "s", "ymax": 100, "lines": lines}
        charts["host-mem"] = {"type": "lines", "unit": "bytes", "xlabel": "s",
                              "lines": [{"label": "host RAM used", "x": _round(memu["x"], 3),
                                         "y": _round(memu["max"], 0), "total": _num(host.get("mem_total"))}]}
        out.append(f'<p>Host: {esc(host.get("cpu_count") or "?")} CPUs, '
                   f'{esc(fmt_bytes(host.get("mem_total")))} RAM.</p>')
        out.append('<div class="grid2">' + chart("host-cpu", "CPU (% of the host's CPUs)",
                                                 "The run's own processes (diag's probe included) and the whole "
                                                 "host.")
                   + chart("host-mem", "Host RAM used")
                   + "</div>")
    elif not devices:
        pass
    out.append("</section>")
    return "".join(out)


def _d(x: Any) -> dict:
    """``x`` when it is a dict, else an empty one (free-form evidence sections are not trusted)."""
    return x if isinstance(x, dict) else {}


def _l(x: Any) -> list:
    return x if isinstance(x, list) else []


def _pct(x: Any) -> str:
    v = _num(x)
    return "N/A" if v is None else f"{v:.0f}%"


def _memory_section(evidence, charts: dict[str, Any]) -> str:
    out = ['<section id="memory"><h2>Memory</h2>']
    r = evidence.primary if evidence.ranks else None
    mem = r.memory if r is not None else {}
    cats, source = None, None
    bd = mem.get("breakdown") if isinstance(mem.get("breakdown"), dict) else None
    est = mem.get("estimate") if isinstance(mem.get("estimate"), dict) else None
    if bd and isinstance(bd.get("categories"), dict):
        cats = bd["categories"]
        source = f"measured by the CUDA allocator at step {bd.get('step', '?')} (the peak)"
    elif est and isinstance((est.get("at_target") or {}).get("categories"), dict):
        cats = est["at_target"]["categories"]
        source = f"estimated by the fake-tensor replay at batch {est.get('target_batch', '?')}"
    elif isinstance(mem.get("persistent"), dict):
        p = mem["persistent"]
        cats = {"parameters": (p.get("params") or 0) + (p.get("buffers") or 0), "gradients": p.get("grads"),
                "optimizer_state": p.get("optimizer_state")}
        source = "persistent tensors only (no allocator statistics: not a CUDA run)"
    if cats:
        vals = [(label, _num(cats.get(k)) or 0.0) for k, label in MEM_CATEGORIES if k in cats]
        total = sum(v for _, v in vals)
        rows = [(label, fmt_bytes(v), f"{v / total:.0%}" if total else "") for label, v in vals]
        rows.append(("total", fmt_bytes(total), "100%" if total else ""))
        charts["mem-breakdown"] = {"type": "breakdown", "labels": [label for label, _ in vals],
                                   "values": [v for _, v in vals]}
        out.append(f'<h3>Breakdown</h3><p class="muted">{esc(source)}.</p>'
                   + table(("category", "bytes", "share"), rows, cls="mem")
                   + chart("mem-breakdown", "Memory breakdown", height=120))
    else:
        out.append('<p class="muted">No memory breakdown in the evidence.</p>')
    out.append(_plan_html(evidence, charts))
    out.append("</section>")
    return "".join(out)


def _plan_html(evidence, charts: dict[str, Any]) -> str:
    plan = evidence.memory_plan if evidence.memory_plan.get("status") else None
    if not plan and evidence.ranks:
        from diag.memory.verdict import build_memory_plan

        try:
            plan = build_memory_plan(evidence)
        except Exception:   # a partial estimate: the plan is left out, the rest of the report stands
            plan = None
    if not plan or plan.get("status") != "ok":
        reason = ((plan or {}).get("reason")
                  or "no batch-size replay was recorded (diag memory records one)")
        return f'<h3>Memory plan</h3><p class="muted">No memory plan: {esc(reason)}.</p>'
    v = _d(plan.get("verdict"))
    est = _d(plan.get("estimate"))
    target = plan.get("target") if isinstance(plan.get("target"), dict) else None
    tname = (target or {}).get("name") or est.get("capacity_source") or "the device"
    facts = [("target device", tname), ("capacity", fmt_bytes(v.get("capacity"))),
             ("usable", fmt_bytes(v.get("usable"))), ("batch observed", v.get("observed_batch")),
             ("target batch", v.get("target_batch")),
             ("fits", {True: "yes", False: "NO"}.get(v.get("fits"), "unknown")),
             ("peak at target", fmt_bytes(v.get("peak_device"))),
             ("largest training batch", v.get("max_batch") if v.get("max_batch") is not None else "N/A"),
             ("largest eval batch", v.get("max_eval_batch") if v.get("max_eval_batch") is not None else "N/A")]
    acc = v.get("accumulation") if isinstance(v.get("accumulation"), dict) else None
    if acc:
        facts.append(("accumulation", f"micro-batch {acc.get('micro_batch')} × {acc.get('steps')} steps = "
                                      f"{acc.get('effective_batch')}"))
    out = ['<h3>Memory plan</h3>', table(("", ""), [(k, "N/A" if x is None else x) for k, x in facts], cls="kv")]
    pts = [p for p in _l(est.get("points")) if isinstance(p, dict) and _num(p.get("batch")) is not None]
    pts.sort(key=lambda p: p["batch"])
    if pts:
        rows = [(p["batch"], fmt_bytes(p.get("device") or p.get("peak")),
                 {True: "yes", False: "no"}.get(p.get("fits"), "?")) for p in pts]
        out.append(table(("batch", "peak on the device", "fits"), rows, cls="plan"))
        charts["mem-plan"] = {"type": "plan", "x": [p["batch"] for p in pts],
                              "y": [_num(p.get("device")) or _num(p.get("peak")) for p in pts],
                              "capacity": _num(v.get("usable")) or _num(v.get("capacity"))}
        out.append(chart("mem-plan", "Peak memory by batch size (replay)", "The line across is the usable "
                                                                          "memory of the target.", height=240))
    return "".join(out)


def _duration(hours: float) -> str:
    return units.fmt_wall_hours(hours)


def _own_cpu_line(g, cpu_count) -> dict | None:
    """The run's process tree's CPU as a share of the host's CPUs (psutil gives 100 per busy core)."""
    procs = g.processes if isinstance(getattr(g, "processes", None), dict) else {}
    ps = procs.get("series") if isinstance(procs.get("series"), dict) else {}
    t = ps.get("t") or []
    n = _num(cpu_count)
    if not t or not n or not any(_num(v) for v in ps.get("cpu") or []):
        return None
    d = downsample(t, [None if _num(v) is None else _num(v) / n for v in (ps.get("cpu") or [None] * len(t))])
    return {"label": "this run", "x": _round(d["x"], 3), "y": _round(d["med"], 2)}


def _money(x: float | None) -> str:
    if x is None:
        return "N/A (no price)"
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}" if x >= 0.01 else f"${x:.2g}"


def _cost_section(evidence, charts: dict[str, Any]) -> str:
    from diag.cost import estimate_measured, from_evidence, load_catalog
    from diag.errors import DiagError

    out = ['<section id="cost"><h2>Cost estimate</h2>']
    try:
        m = from_evidence(evidence)
    except DiagError as e:
        out.append(f'<p class="muted">No cost estimate: {esc(e.message)}.</p></section>')
        return "".join(out)
    except Exception:
        out.append('<p class="muted">No cost estimate: the FLOP measurement is incomplete.</p></section>')
        return "".join(out)
    params = m.params
    if m.units_per_epoch:
        kw, work = {"epochs": 10}, "10 epochs of the run's dataset"
    elif m.unit == "tokens" and params:
        kw, work = {"tokens": 20 * params}, f"{20 * params:.3g} tokens (Chinchilla's 20 per parameter)"
    else:
        kw, work = {"units": m.units_per_s * 3600 * max(m.world_size, 1)}, \
            "one hour of the measured throughput (the dataset's size is unknown)"
    try:
        cat = load_catalog()
        main = estimate_measured(m, catalog=cat, **kw)
    except DiagError as e:
        out.append(f'<p class="muted">No cost estimate: {esc(e.message)}.</p></section>')
        return "".join(out)
    rows = [main]
    for g in cat:
        if g.id == main.gpu:
            continue
        try:
            rows.append(estimate_measured(m, gpu=g.id, count=main.count, catalog=cat, **kw))
        except DiagError:
            continue
    mfu = f"{m.mfu:.1%}" if m.mfu is not None else "N/A (no catalogue peak for this device)"
    out.append(f'<p>Measured: {esc(f"{m.units_per_s:,.1f}")} {esc(m.unit)}/s per device on '
               f'{esc(m.device_name or m.device)} × {esc(main.count)}, MFU {esc(mfu)}, over {esc(m.steps_timed)} '
               f'timed steps. Workload priced: <b>{esc(work)}</b>.</p>')
    on_cpu = m.device == "cpu" and main.gpu in (None, "cpu") and main.cost is None
    kv = [("hardware", main.label), ("wall time", _duration(main.wall_hours))]
    if not on_cpu:      # a CPU run: no GPU-hours or money for its own device (the GPUs are below)
        kv += [("GPU-hours", units.fmt_hours(main.gpu_hours)), ("cost", _money(main.cost))]
    kv += [("basis", main.mfu_basis)] + ([] if on_cpu else [("price", main.price_basis)])
    out.append(table(("", ""), kv, cls="kv"))
    trows = []
    for e in rows[1:]:
        trows.append((e.label, _duration(e.wall_hours), units.fmt_hours(e.gpu_hours), _money(e.cost),
                      units.fmt_pct(e.mfu, style="cost") if e.mfu is not None else "N/A"))
    if trows:
        bases = sorted({e.mfu_basis for e in rows[1:]})
        out.append("<h3>On other GPUs of the catalogue</h3>"
                   + table(("hardware", "wall time", "GPU-hours", "cost", "MFU"), trows, cls="cost")
                   + "".join(f'<p class="muted">MFU: {esc(b)}.</p>' for b in bases))
    priced = sorted([e for e in rows if e.cost is not None], key=lambda e: e.cost)[:12]
    if priced and max(e.cost for e in priced) < 0.01:
        # a workload of a few cents or less: a money axis of $1e-05 steps says nothing
        out.append(f'<p class="muted">On every priced GPU of the catalogue this workload costs under $0.01: '
                   f'no cost chart.</p>')
    elif priced:
        charts["cost"] = {"type": "cost", "labels": [e.label for e in priced],
                          "cost": [float(f"{e.cost:.4g}") for e in priced],
                          "hours": [float(f"{e.wall_hours:.4g}") for e in priced]}
        out.append(chart("cost", "Cost and wall time by GPU (catalogue prices)",
                         "Indicative prices from diag's GPU catalogue, the 12 cheapest.",
                         height=max(180, 26 * len(priced) + 60)))
    if main.notes:
        out.append('<ul class="notes">' + "".join(f"<li>{esc(n)}</li>" for n in main.notes) + "</ul>")
    out.append("</section>")
    return "".join(out)


# ---- the report ----------------------------------------------------------------------------------------

def _guarded(section: str, title: str, fn, *args) -> str:
    """A section, or, when the evidence holds something it cannot draw, the section's heading and one
    sentence saying so (the rest of the report stands; its charts are left out)."""
    charts = args[-1]
    before = dict(charts)
    try:
        return fn(*args)
    except Exception as e:      # odd free-form evidence: a notice in the page, never a traceback
        charts.clear()
        charts.update(before)
        return (f'<section id="{esc(section)}"><h2>{esc(title)}</h2><p class="muted">This section could not be '
                f'drawn from this evidence ({esc(type(e).__name__)}: {esc(e)}).</p></section>')


def report_data(evidence, findings, exit_code: int, comparison=None) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(body markup, data island, header facts) of a check report; with ``comparison`` (``diag check
    --baseline``), a section comparing the run with the baseline comes first."""
    facts = header_facts(evidence, findings, exit_code)
    charts: dict[str, Any] = {}
    baseline = ""
    if comparison is not None:
        from diag.report.compare_html import baseline_section

        baseline = baseline_section(comparison, charts)
    body = "".join([
        _header(evidence, facts),
        '<nav>' + ('<a href="#baseline">Baseline</a> ' if baseline else "")
        + '<a href="#steps">Steps</a> <a href="#findings">Findings</a> <a href="#gpus">GPUs</a> '
        '<a href="#memory">Memory</a> <a href="#cost">Cost</a></nav><main>',
        baseline,
        _guarded("steps", "Steps", _steps_section, evidence, findings, charts),
        _findings(findings),
        _guarded("gpus", "GPUs and host", _gpu_section, evidence, charts),
        _guarded("memory", "Memory", _memory_section, evidence, charts),
        _guarded("cost", "Cost estimate", _cost_section, evidence, charts),
        "</main>",
    ])
    data = {"kind": "check", "facts": facts, "charts": charts}
    if comparison is not None:
        data["comparison"] = comparison.to_dict()
    return body, data, facts


def render_html(evidence, findings, exit_code: int, comparison=None) -> str:
    body, data, facts = report_data(evidence, findings, exit_code, comparison)
    name = (facts["script"] or "in-process run").replace("\\", "/").rsplit("/", 1)[-1]
    return page(f"diag — {name} — {facts['status']}", body, data, simulated=facts["simulated"])
