"""Judging trials: speed-up with a 95% interval, and the guards (crash, NaN/inf loss, a loss curve that
left the baseline's). Pure functions of step times and losses (numpy, no torch, no I/O), tested on
synthetic data.

Speed-up = baseline step / trial step, each the estimate of :func:`diag.compare.stats.compare`
with the statistic :func:`trimmed_mean` (the mean over runs of each run's 10%-trimmed mean step). The "runs" are the
alternated runs of the script (restart knobs) or the alternated blocks of steps of one process
(switch knobs): baseline and trial alternate in rounds, so the interval pairs each trial run with the
baseline run of its round (:func:`paired`): a machine whose load changes during the trials slows
both neighbours alike. The interval reported is the wider of the bootstrap's and the paired one: a
verdict needs both to agree, and at least MIN_VERDICT_STEPS judged steps on each side.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from diag.compare.stats import compare, t_quantile

MIN_EFFECT = 0.03        # a speed-up (or slow-down) under 3% is "no change" even when the interval excludes 1
LOSS_TOLERANCE = 0.10    # the trial's mean loss may differ from the baseline's by 10% of it ...
LOSS_SIGMAS = 3.0        # ... and by 3 standard errors of the difference, before the trial is "broke"
MIN_BLOCK_STEPS = 2      # a block (or run) with fewer judged steps is left out
MIN_VERDICT_STEPS = 20   # fewer judged steps on a side: "unknown" (on a shared machine a few steps say little)
VERDICTS = ("faster", "no change", "slower", "broke", "unknown", "not applicable", "left out")


TRIM = 0.1               # the step statistic: the mean of each run's steps without its slowest and fastest 10%


def trimmed_mean(values, axis: int = -1):
    """The mean without the lowest and highest TRIM of the values along ``axis`` (the statistic
    :func:`diag.compare.stats.compare` is given). Not the median: a run whose loader prefetches has
    steps that alternate between instant and waiting for a batch, and the median of such a run jumps
    between the two (per-run medians of one knob spread 12-70 ms where the trimmed means spread
    33-68 ms); the mean is the throughput, trimmed so that a load spike does not carry it."""
    a = np.sort(np.asarray(values, dtype=float), axis=axis)
    n = a.shape[axis]
    k = int(n * TRIM)
    if k and n - 2 * k >= 1:
        a = np.take(a, np.arange(k, n - k), axis=axis)
    return np.mean(a, axis=axis)


@dataclass
class Side:
    """One side of a trial: per-run (or per-block) step times in seconds, step order kept; the losses
    (step index -> value, every run's); samples per step (median); peak memory in bytes."""
    runs: list[list[float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    samples: float | None = None
    peak_memory: float | None = None

    @property
    def steps(self) -> int:
        return sum(len(r) for r in self.runs)

    def median_step(self) -> float | None:
        """The typical step: the mean over runs of each run's trimmed mean (as the speed-up's estimate)."""
        vals = [float(trimmed_mean(r)) for r in self.runs if r]
        return float(np.mean(vals)) if vals else None

    def samples_per_s(self) -> float | None:
        m = self.median_step()
        return self.samples / m if self.samples and m else None


@dataclass
class Trial:
    """One knob (or the winners combined) against the baseline."""
    knob: str                          # the spec: "dataloader.workers=1", "amp.bf16", "a + b" (combined)
    kind: str                          # "switch" (blocks of one process) | "restart" (runs) | "combined"
    verdict: str = "unknown"           # faster | no change | slower | broke | unknown | not applicable | left out
    why: str = ""                      # one sentence: what the verdict rests on
    speedup: float | None = None       # baseline median step / trial median step
    ci_low: float | None = None
    ci_high: float | None = None
    steps: int = 0                     # the trial's judged steps
    baseline_steps: int = 0
    runs: int = 0                      # the trial's runs (restart) or blocks (switch)
    step_s: float | None = None        # the trial's median step (seconds)
    baseline_step_s: float | None = None
    samples_per_s: float | None = None
    baseline_samples_per_s: float | None = None
    peak_memory: float | None = None   # bytes (CUDA allocator peak; None where not measured)
    baseline_peak_memory: float | None = None
    loss_change: float | None = None   # (trial mean loss - baseline's) / |baseline's|
    applied: str = ""                  # what the probe did ("num_workers 0 -> 1", ...)
    knobs: list[str] = field(default_factory=list)   # the knob ids in it (several when combined)
    # the judged step times (seconds, µs-rounded), pooled over runs or blocks, step order kept:
    # {"baseline": [...], "trial": [...]} (the HTML report draws their distributions)
    step_times: dict[str, list[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d


def paired(base_runs: Sequence[Sequence[float]], trial_runs: Sequence[Sequence[float]],
           confidence: float = 0.95) -> tuple[float, float] | None:
    """The interval of the speed-up from the rounds, each trial run (or block) paired with the baseline
    run (or block) of the same round, its neighbour in time: Student's t over the per-round log
    ratios of the trimmed means. A machine whose load changes from minute to minute slows both neighbours
    alike, so the pairing cancels it where an unpaired interval would take it all as noise. None with
    fewer than 2 complete pairs."""
    pairs = [(b, t) for b, t in zip(base_runs, trial_runs) if len(b) >= MIN_BLOCK_STEPS and len(t) >= MIN_BLOCK_STEPS]
    if len(pairs) < 2:
        return None
    d = np.array([math.log(float(trimmed_mean(b)) / float(trimmed_mean(t))) for b, t in pairs
                  if trimmed_mean(b) > 0 and trimmed_mean(t) > 0])
    if d.size < 2:
        return None
    se = float(d.std(ddof=1)) / math.sqrt(d.size)
    q = t_quantile(1 - (1 - confidence) / 2, d.size - 1)
    return math.exp(float(d.mean()) - q * se), math.exp(float(d.mean()) + q * se)


def speedup(base: Side, trial: Side, seed: int = 0):
    """(speed-up, low, high) or None when a side has too few steps. The estimate and its interval
    come from :func:`diag.compare.stats.compare` (``a`` = trial, ``b`` = baseline: stat(base) /
    stat(trial), above 1 the trial is faster; runs or blocks resampled, Welch's t over their medians);
    with two or more rounds the interval is widened to hold the paired one (:func:`paired`) too, so
    that a verdict needs both views to agree."""
    a = [r for r in trial.runs if len(r) >= MIN_BLOCK_STEPS]
    b = [r for r in base.runs if len(r) >= MIN_BLOCK_STEPS]
    if not a or not b:
        return None
    eff = compare(a, b, kind="ratio", statistic=trimmed_mean, seed=seed)
    if eff is None:
        return None
    p = paired(base.runs, trial.runs)
    if p is None:
        return eff.estimate, eff.low, eff.high
    # both views must agree: the bootstrap over runs (or blocks) and the pairing by round
    return eff.estimate, min(p[0], eff.low, eff.estimate), max(p[1], eff.high, eff.estimate)


def loss_guard(base: Sequence[float], trial: Sequence[float]) -> tuple[str | None, float | None]:
    """(why it broke or None, the relative change of the mean loss). Non-finite trial losses break
    it when the baseline's are finite; a mean loss that moved by more than LOSS_TOLERANCE of the
    baseline's *and* by more than LOSS_SIGMAS standard errors of the difference breaks it."""
    t = np.asarray(list(trial), dtype=float)
    b = np.asarray(list(base), dtype=float)
    if t.size and not np.all(np.isfinite(t)):
        if b.size == 0 or np.all(np.isfinite(b)):
            bad = t[~np.isfinite(t)][0]
            return f"the loss became {'nan' if math.isnan(bad) else 'inf'} with the knob on", None
        return None, None
    b = b[np.isfinite(b)]
    if t.size < 2 or b.size < 2:
        return None, None
    mb, mt = float(b.mean()), float(t.mean())
    if mb == 0:
        return None, None
    rel = (mt - mb) / abs(mb)
    se = math.sqrt(float(t.var(ddof=1)) / t.size + float(b.var(ddof=1)) / b.size)
    if abs(rel) > LOSS_TOLERANCE and abs(mt - mb) > LOSS_SIGMAS * se:
        return (f"the loss departed from the baseline's: mean {mt:.4g} against {mb:.4g} "
                f"({rel:+.0%}, beyond the {LOSS_TOLERANCE:.0%} tolerance)"), rel
    return None, rel


def verdict_of(est: float, low: float, high: float) -> str:
    if low > 1.0 and est >= 1.0 + MIN_EFFECT:
        return "faster"
    if high < 1.0 and est <= 1.0 - MIN_EFFECT:
        return "slower"
    return "no change"


def judge(trial: Trial, base: Side, side: Side, seed: int = 0) -> Trial:
    """Fill ``trial``'s numbers and verdict from the two sides (the guards first)."""
    trial.steps, trial.baseline_steps = side.steps, base.steps
    trial.runs = len([r for r in side.runs if r])
    trial.step_s, trial.baseline_step_s = side.median_step(), base.median_step()
    trial.samples_per_s, trial.baseline_samples_per_s = side.samples_per_s(), base.samples_per_s()
    trial.peak_memory, trial.baseline_peak_memory = side.peak_memory, base.peak_memory
    trial.step_times = {name: [round(float(x), 6) for r in s.runs for x in r if math.isfinite(float(x))]
                        for name, s in (("baseline", base), ("trial", side))}
    broke, rel = loss_guard(base.losses, side.losses)
    trial.loss_change = rel
    s = speedup(base, side, seed)
    if s is not None:
        trial.speedup, trial.ci_low, trial.ci_high = s
    if broke:
        trial.verdict, trial.why = "broke", broke
        return trial
    if s is not None and min(side.steps, base.steps) < MIN_VERDICT_STEPS:
        trial.verdict = "unknown"
        trial.why = (f"too few steps for a verdict ({side.steps} with the knob, {base.steps} without; "
                     f"{MIN_VERDICT_STEPS} each are needed): give the script more steps (its arguments after --) "
                     "or a larger --budget")
        return trial
    if s is None:
        trial.verdict = "unknown"
        trial.why = (f"too few steps to judge ({side.steps} with the knob, {base.steps} without; at least "
                     f"{MIN_BLOCK_STEPS} per run or block are needed)")
        return trial
    trial.verdict = verdict_of(*s)
    est, low, high = s
    if trial.verdict == "faster":
        trial.why = f"{est:.2f}x faster (95% interval {low:.2f}-{high:.2f}) over {side.steps} steps"
    elif trial.verdict == "slower":
        trial.why = f"{1 / est:.2f}x slower (95% interval of the speed-up {low:.2f}-{high:.2f})"
    else:
        trial.why = (f"the interval {low:.2f}-{high:.2f} holds 1x (no change)" if low <= 1.0 <= high else
                     f"{est:.2f}x is under the {MIN_EFFECT:.0%} that counts as a change")
    return trial


def failed(trial: Trial, why: str) -> Trial:
    trial.verdict, trial.why = "broke", why
    return trial


# ---- splitting one process's steps by arm ---------------------------------------------------------

def split_arms(steps: Sequence[dict], losses: dict[int, float]) -> dict[str, Side]:
    """Steps of an alternating run (each ``{"index", "total_s", "samples", "instrumented", "extra":
    {"try": arm, "try_block": n}}``) -> one Side per arm, each block a "run". The warm-up and the
    first step of every block (the arm just changed) are left out."""
    blocks: dict[tuple[str, int], list[dict]] = {}
    for s in steps:
        extra = s.get("extra") or {}
        arm, blk = extra.get("try"), extra.get("try_block")
        if not arm or arm == "warmup" or blk is None:
            continue
        blocks.setdefault((arm, int(blk)), []).append(s)
    sides: dict[str, Side] = {}
    for (arm, _blk), rows in sorted(blocks.items(), key=lambda kv: kv[0][1]):
        rows = sorted(rows, key=lambda r: r["index"])[1:]
        rows = [r for r in rows if not r.get("instrumented") and r.get("total_s", 0) > 0]
        side = sides.setdefault(arm, Side())
        side.runs.append([float(r["total_s"]) for r in rows])
        side.losses.extend(losses[r["index"]] for r in rows if r["index"] in losses)
    for arm, side in sides.items():
        samp = [r.get("samples") for r in steps if (r.get("extra") or {}).get("try") == arm and r.get("samples")]
        side.samples = float(np.median(samp)) if samp else None
    return sides


def steady(steps: Sequence[dict], skip: int) -> list[dict]:
    """A run's steps without the instrumented ones and its first ``skip`` (warm-up)."""
    rows = [s for s in sorted(steps, key=lambda r: r["index"]) if not s.get("instrumented") and s.get("total_s", 0) > 0]
    return rows[skip:] if len(rows) > skip + MIN_BLOCK_STEPS else rows[-MIN_BLOCK_STEPS:] if rows else []


def summary(trials: Sequence[Trial]) -> str:
    """One line: the best measured result and what it rests on."""
    ok = [t for t in trials if t.verdict == "faster" and t.speedup]
    if not ok:
        tried = [t for t in trials if t.verdict in ("no change", "slower", "broke", "faster", "unknown")]
        if not tried:
            return "no knob could be trialled"
        return f"no knob made the step significantly faster ({len(tried)} trialled)"
    best = max(ok, key=lambda t: t.speedup or 0)
    same = "same loss curve" if best.loss_change is not None and abs(best.loss_change) <= LOSS_TOLERANCE else \
        "loss not compared"
    return (f"{best.knob}: {best.speedup:.2f}x faster ({best.ci_low:.2f}-{best.ci_high:.2f}) "
            f"in {best.steps} steps, {same}")
