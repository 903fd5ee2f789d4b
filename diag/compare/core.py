"""Two sides (one or more runs each) -> a Comparison: per-metric effects with confidence intervals,
verdicts against thresholds, the phases that explain a step-time change, the findings diff, and what
differs between the runs. Works on :class:`diag.compare.extract.RunSample` only."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diag.compare import extract, stats
from diag.compare.extract import PHASES, RunSample
from diag.errors import DiagError

COMPARE_SCHEMA_VERSION = 1

# metric key -> (label, unit, higher_is_better, threshold key)
METRICS: dict[str, tuple[str, str, bool, str]] = {
    "step_time": ("step time", "s", False, "step"),
    **{f"phase.{p}": (f"  {p}", "s", False, p) for p in PHASES},
    "samples_per_s": ("samples/s", "1/s", True, "throughput"),
    "tokens_per_s": ("tokens/s", "1/s", True, "throughput"),
    "data_share": ("data-wait share", "share", False, "data-wait"),
    "allocator_peak": ("peak memory (allocator)", "bytes", False, "memory"),
    "device_peak": ("peak memory (device)", "bytes", False, "memory"),
    "persistent_memory": ("memory (params+grads+optim)", "bytes", False, "memory"),
    "mfu": ("MFU", "share", True, "mfu"),
    "time_to_first_step": ("time to first step", "s", False, "first-step"),
    # device clock (CUDA runs with a device timeline on both sides): reported, never gated
    **{f"device.{k}": (label, "s", False, "device") for k, label in (
        ("total", "step time (device clock)"), ("busy", "  GPU busy (device clock)"),
        ("idle", "  GPU idle (device clock)"), ("idle_data", "  GPU idle for data (device clock)"),
        ("idle_h2d", "  GPU idle in copies (device clock)"),
        ("idle_sync", "  GPU idle after syncs (device clock)"),
        ("idle_host", "  GPU idle in Python (device clock)"), ("eval", "  GPU evaluating (device clock)"))},
}
# device-clock causes the attribution names: metric key -> words for the headline
DEVICE_CAUSES = {"device.idle_data": "GPU idle for data", "device.idle_h2d": "GPU idle in copies",
                 "device.idle_sync": "GPU idle after syncs", "device.idle_host": "GPU idle in Python",
                 "device.busy": "GPU busy"}
# thresholds keys a user may give, and which ones the global --max-regression sets
THRESHOLD_KEYS = ("step", "throughput", "memory", "mfu", "data-wait", "first-step") + PHASES
GLOBAL_KEYS = ("step", "throughput", "memory", "mfu")
DEFAULT_MAX_REGRESSION = 0.05
# runs per side needed to gate a timing metric: one run per side carries no measure of the run-to-run
# variance of a shared machine (block resampling inside one run does not see it: two unchanged runs of
# a makemore-style script read +26%, CI +10..+65%, and -21% swapped). bench/bench_compare_pairs.py
# measures the false-alarm rate per runs-per-side on same-code pairs (README, "CI"): on this project's
# loaded 2-core VM, 1v1 gated 534 of 2,256 same-code pairs, 2v2 (interleaved) 3 of 90, 3v3 0 of 86.
DEFAULT_MIN_RUNS = 3
# timing metrics (threshold keys): not gated with fewer runs than min_runs on a side; memory is
# (the allocator's and the device's peaks do not vary from run to run)
TIMING_KEYS = ("step", "throughput", "mfu", "data-wait", "first-step") + PHASES
SCALAR_NOISE = {"allocator_peak": 0.0, "device_peak": 0.0, "persistent_memory": 0.0}

_SEVERITY_RANK = {"crashed": 4, "error": 3, "warning": 2, "info": 1, "pass": 0, "skipped": -1}


@dataclass
class MetricResult:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    a: float | None
    b: float | None
    change: float | None            # relative (0.12 = +12%), or difference for data_share (points/100)
    low: float | None
    high: float | None
    relative: bool
    threshold: float | None
    verdict: str                    # regression | worse | improved | unchanged | unknown
    gated: bool                     # a regression here fails the comparison
    method: str                     # bootstrap | single-value | repeats
    n_a: int = 0
    n_b: int = 0
    note: str | None = None
    delta: float | None = None      # b - a in the metric's unit
    delta_low: float | None = None  # its confidence interval (phases: seconds)
    delta_high: float | None = None
    clock: str | None = None        # "device" for device-timeline metrics; None: the host clock

    def to_dict(self) -> dict[str, Any]:
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v)
                for k, v in self.__dict__.items() if not (k == "clock" and v is None)}

    @property
    def is_phase(self) -> bool:
        """A per-phase time (host phases and device-clock times): shown in ms, never gated."""
        return self.key.startswith(("phase.", "device."))


@dataclass
class Comparison:
    base: list[RunSample]
    new: list[RunSample]
    metrics: list[MetricResult]
    attribution: list[dict[str, Any]]        # phases that explain the step-time change
    findings: dict[str, list[dict]]          # new, gone, changed
    differences: list[dict[str, Any]]        # facts that differ (informational or refused-with-force)
    forced: list[str]                        # blocking differences overridden by --force
    thresholds: dict[str, float]
    confidence: float
    noise: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)           # how the sides were compared (scripts differ, ...)
    unjudged: str | None = None     # why the timing metrics were not gated (too few runs per side), or None

    @property
    def regressions(self) -> list[MetricResult]:
        return [m for m in self.metrics if m.verdict == "regression" and m.gated]

    @property
    def improvements(self) -> list[MetricResult]:
        return [m for m in self.metrics if m.verdict == "improved" and not m.is_phase]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def metric(self, key: str) -> MetricResult | None:
        return next((m for m in self.metrics if m.key == key), None)

    @property
    def headline(self) -> str:
        """One line: the step-time verdict and where the time went."""
        m = self.metric("step_time")
        what = m.label if m is not None else "step time"
        if m is None or m.change is None:
            return f"{what}: not enough steady-state steps to compare"
        ci = (f" ({int(self.confidence * 100)}% CI {pct(m.low)}…{pct(m.high)})"
              if m.low is not None else "")
        text = f"{what} {pct(m.change)}{ci}"
        if m.verdict == "unchanged":
            text += f": not significant (noise ±{abs((m.high - m.low) / 2) * 100:.1f}%)"
        elif self.attribution:
            text += ": " + ", ".join(f"{a['phase']} {ms(a['delta_s'])}"
                                     + (f" ({a['clock']} clock)" if a.get("clock") else "")
                                     for a in self.attribution)
        if self.unjudged:
            text += f" — {self.unjudged}"
        if m.verdict in ("regression", "worse"):
            # the new findings that probably explain it (error and warning first)
            causes = [f for f in self.findings.get("new", []) if f.get("severity") in ("crashed", "error", "warning")]
            if causes:
                text += "; new findings: " + ", ".join(
                    f["id"] + (f" at {f['location']}" if f.get("location") else "") for f in causes[:3])
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": COMPARE_SCHEMA_VERSION,
            "verdict": "regression" if self.regressions else "ok",
            "exit_code": self.exit_code,
            "headline": self.headline,
            "confidence": self.confidence,
            "thresholds": self.thresholds,
            "base": [_side_dict(s) for s in self.base],
            "new": [_side_dict(s) for s in self.new],
            "metrics": [m.to_dict() for m in self.metrics],
            "regressions": [m.key for m in self.regressions],
            "improvements": [m.key for m in self.improvements],
            "attribution": self.attribution,
            "findings": self.findings,
            "differences": self.differences,
            "forced": self.forced,
            "noise": self.noise,
            "notes": self.notes,
            "judged": self.unjudged is None,
            "unjudged": self.unjudged,
        }


def _side_dict(s: RunSample) -> dict[str, Any]:
    f = s.facts
    return {"source": s.source, "script": f.get("script"), "kind": s.kind, "status": s.status, "steps": s.steps_total,
            "steady_steps": s.steady, "excluded": s.excluded, "batch": f.get("batch"),
            "world_size": f.get("world_size"), "device": f.get("device"), "gpu_models": f.get("gpu_models"),
            "torch": f.get("torch")}


# ---- formatting helpers (shared by the renderers) -------------------------------------------------

def pct(x: float | None) -> str:
    if x is None or not np.isfinite(x):
        return "n/a"
    return f"{x * 100:+.1f}%"


def ms(seconds: float | None) -> str:
    if seconds is None or not np.isfinite(seconds):
        return "n/a"
    v = seconds * 1000
    return f"{v:+.1f} ms" if abs(v) < 100 else f"{v:+.0f} ms"


def fmt_value(v: float | None, unit: str) -> str:
    if v is None or not np.isfinite(v):
        return "n/a"
    if unit == "s":
        return f"{v * 1000:.2f} ms" if v < 1 else f"{v:.2f} s"
    if unit == "bytes":
        for u, d in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
            if v >= d:
                return f"{v / d:.1f} {u}"
        return f"{v:.0f} B"
    if unit == "share":
        return f"{v * 100:.1f}%"
    return f"{v:,.1f}" if v < 1e4 else f"{v:,.0f}"


# ---- thresholds -----------------------------------------------------------------------------------

def parse_thresholds(values: list[str] | None) -> dict[str, float]:
    """``--max-regression 5%`` (every gated metric) and ``step=5%,memory=10%,mfu=3%`` (per metric).
    Returns key -> fraction; DiagError on bad input."""
    out = {k: DEFAULT_MAX_REGRESSION for k in GLOBAL_KEYS}
    for value in values or []:
        for part in [p.strip() for p in value.split(",") if p.strip()]:
            if "=" in part:
                key, _, num = part.partition("=")
                key = key.strip().lower().replace("_", "-")
                aliases = {"step-time": "step", "time": "step", "mem": "memory", "samples": "throughput",
                           "tokens": "throughput", "first": "first-step"}
                key = aliases.get(key, key)
                if key not in THRESHOLD_KEYS:
                    raise DiagError(f"unknown metric {key!r} in --max-regression (one of: "
                                    f"{', '.join(THRESHOLD_KEYS)})")
                out[key] = _fraction(num, part)
            else:
                v = _fraction(part, part)
                for k in GLOBAL_KEYS:
                    out[k] = v
    return out


def _fraction(text: str, whole: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(%?)\s*", text)
    if not m:
        raise DiagError(f"--max-regression {whole!r}: expected a percentage such as 5% (or 0.05)")
    v = float(m.group(1))
    v = v / 100 if m.group(2) or v >= 1 else v
    if not 0 <= v <= 100:
        raise DiagError(f"--max-regression {whole!r}: a percentage between 0% and 10000%")
    return v


# ---- comparability --------------------------------------------------------------------------------

# two different scripts are the everyday before/after of a fix: compared, with a note (not refused)
BLOCKING = (("kind", "run kinds"), ("batch", "batch sizes"),
            ("world_size", "world sizes"), ("device", "devices"), ("gpu_models", "GPU models"))
INFORMATIONAL = ("script_name", "status", "torch", "cuda", "python", "hostname", "cpu_count", "torch_num_threads", "args",
                 "simulated_gpus", "diag_version")


def differences(base: list[RunSample], new: list[RunSample]) -> list[dict[str, Any]]:
    """Facts that are not the same on the two sides: [{"fact", "base", "new", "blocking"}]."""
    out = []

    def values(side, key):
        vals = []
        for s in side:
            v = s.kind if key == "kind" else s.facts.get(key)    # (a report older than the kind: training)
            v = tuple(v) if isinstance(v, list) else v
            if v not in vals:
                vals.append(v)
        return vals

    for key, _ in BLOCKING:
        va, vb = values(base, key), values(new, key)
        if key == "gpu_models" and not any(va) and not any(vb):
            continue
        if va != vb:
            out.append({"fact": key, "base": _show(va), "new": _show(vb), "blocking": True})
    for key in INFORMATIONAL:
        va, vb = values(base, key), values(new, key)
        if va != vb:
            out.append({"fact": key, "base": _show(va), "new": _show(vb), "blocking": False})
    ea: dict = {}
    eb: dict = {}
    for s in base:
        ea.update(s.facts.get("env") or {})
    for s in new:
        eb.update(s.facts.get("env") or {})
    for k in sorted(set(ea) | set(eb)):
        if ea.get(k) != eb.get(k):
            out.append({"fact": f"env {k}", "base": ea.get(k), "new": eb.get(k), "blocking": False})
    return out


def _show(vals: list) -> Any:
    vals = [list(v) if isinstance(v, tuple) else v for v in vals]
    return vals[0] if len(vals) == 1 else vals


def refusal(diffs: list[dict[str, Any]]) -> str | None:
    """One sentence saying why two sides must not be compared, or None."""
    blocking = [d for d in diffs if d["blocking"]]
    if not blocking:
        return None
    names = dict(BLOCKING)
    parts = [f"{names[d['fact']]} differ ({_plain(d['base'])} vs {_plain(d['new'])})" for d in blocking]
    return ("refusing to compare: " + "; ".join(parts) + " — rerun both sides alike, or pass --force "
            "to compare anyway")


def _plain(v: Any) -> str:
    if isinstance(v, list):
        return "/".join(_plain(x) for x in v) or "none"
    return "none" if v is None else str(v)


# ---- the comparison -------------------------------------------------------------------------------

def compare(base: list[RunSample], new: list[RunSample], *, thresholds: dict[str, float] | None = None,
            force: bool = False, confidence: float = stats.DEFAULT_CONFIDENCE, seed: int = 0,
            resamples: int = stats.DEFAULT_RESAMPLES, min_runs: int = DEFAULT_MIN_RUNS) -> Comparison:
    if not base or not new:
        raise DiagError("compare needs at least one run on each side")
    thresholds = dict(thresholds if thresholds is not None else parse_thresholds(None))
    diffs = differences(base, new)
    why = refusal(diffs)
    if why and not force:
        raise DiagError(why)
    forced = [d["fact"] for d in diffs if d["blocking"]] if force else []
    evaluation = all(s.kind == "evaluation" for s in base + new)
    for side, name in ((base, "baseline"), (new, "new run")):
        for s in side:
            if s.steady < stats.MIN_STEPS:
                if s.kind == "evaluation":
                    raise DiagError(f"the {name} {s.source!r} (an evaluation run) has {s.steady} steady-state "
                                    f"evaluation step(s) ({s.steps_total} recorded); at least {stats.MIN_STEPS} "
                                    "are needed — evaluate more batches")
                raise DiagError(f"the {name} {s.source!r} has {s.steady} steady-state step(s) "
                                f"({s.steps_total} recorded); at least {stats.MIN_STEPS} are needed "
                                "— run more steps (--steps)")

    kw = dict(confidence=confidence, seed=seed, resamples=resamples)
    results: list[MetricResult] = []

    def per_step(key: str, field_: str, *, kind="ratio", statistic=np.median):
        label, unit, hib, tkey = METRICS[key]
        if evaluation:
            label = EVAL_LABELS.get(key, label)
        sa = [s.steps[field_] for s in base if field_ in s.steps]
        sb = [s.steps[field_] for s in new if field_ in s.steps]
        if len(sa) != len(base) or len(sb) != len(new):
            return None
        eff = stats.compare(sa, sb, kind=kind, statistic=statistic, **kw)
        if eff is None:
            a = float(np.mean([statistic(x) for x in sa])) if sa else None
            b = float(np.mean([statistic(x) for x in sb])) if sb else None
            res = MetricResult(key, label, unit, hib, a, b, None, None, None, kind == "ratio",
                               thresholds.get(tkey), "unknown", tkey in thresholds, "bootstrap",
                               note="no interval (too few values, or zero on one side)")
            results.append(res)
            return res
        thr = thresholds.get(tkey)
        res = MetricResult(key, label, unit, hib, eff.a, eff.b, eff.change, eff.change_low, eff.change_high,
                           kind == "ratio", thr, stats.verdict(eff, thr, hib), tkey in thresholds,
                           "repeats" if eff.runs_a > 1 or eff.runs_b > 1 else "bootstrap",
                           n_a=eff.n_a, n_b=eff.n_b, note="; ".join(eff.notes) or None, delta=eff.b - eff.a)
        results.append(res)
        return res, eff

    step = per_step("step_time", "total_s")
    phase_effects = {}
    for p in PHASES:
        if evaluation and p in ("backward", "optimizer"):
            continue                  # an evaluation step has neither
        r = per_step(f"phase.{p}", f"{p}_s", kind="diff")
        if isinstance(r, tuple):
            phase_effects[p] = r[1]
            r[0].change = _rel(r[1])
            r[0].delta_low, r[0].delta_high = r[1].low, r[1].high
            r[0].low, r[0].high = _rel_bounds(r[1])
            r[0].relative = True
    device_effects = {}
    if all("device.total_s" in s.steps for s in base + new):
        # both sides have a device timeline: the same comparison on the device clock
        for name in extract.DEVICE_FIELDS:
            key = f"device.{name[:-2]}"
            field_ = f"device.{name}"
            if key != "device.total" and not any(np.any(s.steps[field_] > 0) for s in base + new):
                continue            # a cause that never occurred on either side
            r = per_step(key, field_, kind="diff")
            if isinstance(r, tuple):
                device_effects[key] = r[1]
                r[0].change = _rel(r[1])
                r[0].delta_low, r[0].delta_high = r[1].low, r[1].high
                r[0].low, r[0].high = _rel_bounds(r[1])
                r[0].relative = True
                r[0].gated = False
                r[0].clock = "device"
            elif r is not None:
                r.gated = False
                r.clock = "device"
    for unit in ("samples", "tokens"):
        per_step(f"{unit}_per_s", f"{unit}_per_s")
    per_step("data_share", "data_share", kind="diff", statistic=stats.mean_share)

    _scalar(results, "allocator_peak", "allocator_peak_bytes", base, new, thresholds, **kw)
    _scalar(results, "device_peak", "device_peak_bytes", base, new, thresholds, **kw)
    _scalar(results, "persistent_memory", "persistent_bytes", base, new, thresholds, **kw)
    _scalar(results, "mfu", "mfu", base, new, thresholds, **kw)
    _scalar(results, "time_to_first_step", "time_to_first_step_s", base, new, thresholds, **kw)

    if isinstance(step, tuple):
        _mfu_from_step(results, step[1])
    attribution = _attribute(step[0] if isinstance(step, tuple) else None, phase_effects)
    if device_effects:
        attribution = _attribute_device(step[0] if isinstance(step, tuple) else None, device_effects,
                                        attribution)
    fdiff = findings_diff(base, new)
    noise = {}
    if isinstance(step, tuple):
        eff = step[1]
        noise = {"step_time_ci_half_width": round(eff.noise, 6),
                 "run_spread_base": eff.run_spread_a, "run_spread_new": eff.run_spread_b}
    notes = []
    sd = next((d for d in diffs if d["fact"] == "script_name"), None)
    if sd:
        notes.append(f"scripts differ ({_plain(sd['base'])} vs {_plain(sd['new'])}): compared as a before/after "
                     "of one job (the same loop is assumed; the batch size, kind and devices were checked alike)")
    unjudged = None
    runs = min(len(base), len(new))
    if runs < max(int(min_runs), 1):
        held = [m for m in results if m.gated and m.threshold is not None and METRICS[m.key][3] in TIMING_KEYS
                and m.verdict == "regression"]
        for m in results:
            if METRICS[m.key][3] in TIMING_KEYS and m.gated:
                m.gated = False
                m.note = "; ".join(x for x in (m.note, f"not gated: {runs} run(s) per side") if x)
        unjudged = (f"not enough runs to judge: {len(base)} vs {len(new)} run(s) per side give no measure of the "
                    "run-to-run variance, so timing changes are reported, not gated"
                    + (f" ({', '.join(m.label.strip() for m in held)} would have failed)" if held else "")
                    + f"; compare {max(int(min_runs), 2)}+ runs per side (--runs {max(int(min_runs), 2)}), or --min-runs 1 on a machine "
                    "whose run-to-run noise you know")
        noise["min_runs"] = int(min_runs)
    return Comparison(base=base, new=new, metrics=results, attribution=attribution, findings=fdiff,
                      differences=diffs, forced=forced, thresholds=thresholds, confidence=confidence,
                      noise=noise, notes=notes, unjudged=unjudged)


# an evaluation run's steps are evaluation steps (one forward on one batch): the metrics say so
EVAL_LABELS = {"step_time": "evaluation step time", "time_to_first_step": "time to first evaluation step"}


def _mfu_from_step(results: list[MetricResult], step: stats.Effect) -> None:
    """MFU is FLOPs / step time / peak: with one value per run, its interval is the step-time
    ratio's interval carried over (FLOPs per step are counted, not timed)."""
    m = next((r for r in results if r.key == "mfu"), None)
    if m is None or m.method != "single-value" or not m.a or not m.b or step.low <= 0:
        return
    r = m.b / m.a
    m.change = r - 1
    m.low, m.high = r * step.estimate / step.high - 1, r * step.estimate / step.low - 1
    m.method = "from step time"
    m.gated = m.threshold is not None
    eff = stats.Effect(a=m.a, b=m.b, kind="ratio", estimate=r, low=m.low + 1, high=m.high + 1,
                       confidence=step.confidence, n_a=step.n_a, n_b=step.n_b)
    m.verdict = stats.verdict(eff, m.threshold, True)
    m.note = "interval from the step-time interval (FLOPs per step are counted once)"


def _rel(eff: stats.Effect) -> float | None:
    return eff.estimate / eff.a if eff.a > 0 else None


def _rel_bounds(eff: stats.Effect) -> tuple[float | None, float | None]:
    if eff.a <= 0:
        return None, None
    return eff.low / eff.a, eff.high / eff.a


def _scalar(results, key, field_, base, new, thresholds, **kw) -> None:
    """Metrics with one value per run: with one run per side, the plain relative change (memory
    peaks are deterministic enough); with repeats, the bootstrap over runs."""
    label, unit, hib, tkey = METRICS[key]
    if all(s.kind == "evaluation" for s in base + new):
        label = EVAL_LABELS.get(key, label)
    va = [s.scalars.get(field_) for s in base]
    vb = [s.scalars.get(field_) for s in new]
    va = [float(v) for v in va if isinstance(v, (int, float))]
    vb = [float(v) for v in vb if isinstance(v, (int, float))]
    if not va or not vb:
        return
    a, b = float(np.mean(va)), float(np.mean(vb))
    thr = thresholds.get(tkey)
    gated = tkey in thresholds
    if len(va) >= stats.MIN_STEPS and len(vb) >= stats.MIN_STEPS:
        eff = stats.compare(va, vb, kind="ratio", statistic=np.mean, **kw)
        if eff is not None:
            results.append(MetricResult(key, label, unit, hib, a, b, eff.change, eff.change_low,
                                        eff.change_high, True, thr, stats.verdict(eff, thr, hib), gated,
                                        "repeats", n_a=len(va), n_b=len(vb), delta=b - a))
            return
    if a <= 0:
        return
    change = b / a - 1
    worse = -change if hib else change
    noisy = key not in SCALAR_NOISE
    if noisy:
        # one value per side and no repeats: no interval; reported, never failed on
        verdict = "unknown"
        note = "one value per run: no interval (use --runs for one); reported, not gated"
        results.append(MetricResult(key, label, unit, hib, a, b, change, None, None, True, thr, verdict,
                                    False, "single-value", n_a=len(va), n_b=len(vb), note=note, delta=b - a))
        return
    if worse > (thr if thr is not None else float("inf")):
        verdict = "regression"
    elif worse > 0.001:
        verdict = "worse"
    elif worse < -0.001:
        verdict = "improved"
    else:
        verdict = "unchanged"
    results.append(MetricResult(key, label, unit, hib, a, b, change, change, change, True, thr, verdict,
                                gated, "single-value", n_a=len(va), n_b=len(vb),
                                note="memory peaks are read once per run (deterministic for a given "
                                     "script and batch)", delta=b - a))


def _attribute(step: MetricResult | None, phases: dict[str, stats.Effect]) -> list[dict[str, Any]]:
    """Phases whose change is significant and in the direction of the step-time change, largest first."""
    if step is None or step.verdict in ("unchanged", "unknown"):
        return []
    sign = 1 if (step.change or 0) > 0 else -1
    total = abs(step.delta or 0)
    out = []
    for p, eff in phases.items():
        if not eff.significant or np.sign(eff.estimate) != sign:
            continue
        if total and abs(eff.estimate) < 0.1 * total:
            continue
        out.append({"phase": p, "delta_s": eff.estimate, "low_s": eff.low, "high_s": eff.high,
                    "base_s": eff.a, "new_s": eff.b,
                    "share_of_change": (abs(eff.estimate) / total) if total else None})
    out.sort(key=lambda d: -abs(d["delta_s"]))
    return out


def _attribute_device(step: MetricResult | None, effects: dict[str, stats.Effect],
                      host: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The host attribution, then the device-clock causes (GPU idle by cause, GPU busy) whose change
    is significant and in the direction of the step-time change, marked ``clock: "device"``."""
    named = {k: e for k, e in effects.items() if k in DEVICE_CAUSES}
    dev = _attribute(step, {DEVICE_CAUSES[k]: e for k, e in named.items()})
    for d in dev:
        d["clock"] = "device"
    return host + dev


# ---- findings ---------------------------------------------------------------------------------------

# Findings about diag itself (its probe's own cost), not about the job: a regression gate compares the
# job, and the probe's share of a short step flickers around its threshold from run to run.
ABOUT_DIAG = ("probe.",)


def findings_diff(base: list[RunSample], new: list[RunSample]) -> dict[str, list[dict]]:
    """new, gone and severity-changed findings (pass and skipped results are not findings, nor are
    the findings about diag's own probe: :data:`ABOUT_DIAG`)."""
    def index(side):
        out: dict[str, dict] = {}
        for s in side:
            for f in s.findings:
                sev = f.get("severity")
                if sev in ("pass", "skipped") or not f.get("id") or str(f["id"]).startswith(ABOUT_DIAG):
                    continue
                key = f["id"]
                if key not in out or _SEVERITY_RANK.get(sev, 0) > _SEVERITY_RANK.get(out[key]["severity"], 0):
                    out[key] = f
        return out

    a, b = index(base), index(new)
    def brief(f):
        loc = f.get("location") or None
        where = None
        if isinstance(loc, dict) and loc.get("file"):
            where = f"{loc['file'].rsplit('/', 1)[-1]}:{loc['line']}" if loc.get("line") else loc["file"].rsplit("/", 1)[-1]
        return {"id": f["id"], "severity": f.get("severity"), "title": f.get("title"),
                "message": f.get("message"), "location": where}

    new_ = [brief(b[k]) for k in sorted(set(b) - set(a))]
    gone = [brief(a[k]) for k in sorted(set(a) - set(b))]
    changed = []
    for k in sorted(set(a) & set(b)):
        if a[k].get("severity") != b[k].get("severity"):
            d = brief(b[k])
            d["severity_before"] = a[k].get("severity")
            changed.append(d)
    new_.sort(key=lambda f: -_SEVERITY_RANK.get(f["severity"], 0))
    return {"new": new_, "gone": gone, "changed": changed}
