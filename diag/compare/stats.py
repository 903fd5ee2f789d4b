"""Noise-aware statistics for comparing two runs (numpy only, deterministic for a given seed).

The unit of comparison is a *side*: one or more runs, each a sequence of steady-state per-step values
(in step order). The effect of B against A is estimated with a hierarchical bootstrap:

* inside a run, a **moving-block bootstrap** (blocks of ``ceil(n ** (1/3))`` consecutive steps) so
  that slow drifts of a shared, loaded machine (correlated neighbouring steps) widen the interval
  instead of posing as a difference;
* across runs (when a side has two or more), the runs themselves are resampled, so run-to-run
  variation enters the interval too;
* a side with a single run is cut into :data:`SEGMENTS` contiguous segments that stand in for runs:
  a shared machine whose load changes from minute to minute makes the segments differ, and that
  drift (the best view of run-to-run variation one run gives) widens the interval. On a quiet
  machine the segments agree and the interval stays narrow.

A side's statistic is the mean over its runs of each run's statistic (the median by default); the
effect is ``stat(B) / stat(A)`` (a ratio) or ``stat(B) - stat(A)`` (a difference) with a percentile
confidence interval. A change is *significant* only when the interval excludes "no change"; it is a
*regression* only when the whole interval lies beyond the threshold.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
MIN_STEPS = 3          # fewer steady-state steps than this on a side: no interval, no verdict
SEGMENTS = 4           # a single run is cut into this many segments (when each has >= MIN_SEGMENT steps)
MIN_SEGMENT = 5


@dataclass
class Effect:
    """B against A for one metric."""
    a: float                      # the statistic of side A (mean over its runs)
    b: float
    kind: str                     # "ratio" | "diff"
    estimate: float               # b / a or b - a
    low: float                    # confidence interval of the estimate
    high: float
    confidence: float
    n_a: int                      # steps (or values) on each side
    n_b: int
    runs_a: int = 1
    runs_b: int = 1
    run_spread_a: float | None = None   # relative spread of the per-run statistics (std / mean), >= 2 runs
    run_spread_b: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def change(self) -> float:
        """Relative change for ratios (0.12 = +12%), the difference itself for diffs."""
        return self.estimate - 1.0 if self.kind == "ratio" else self.estimate

    @property
    def change_low(self) -> float:
        return self.low - 1.0 if self.kind == "ratio" else self.low

    @property
    def change_high(self) -> float:
        return self.high - 1.0 if self.kind == "ratio" else self.high

    @property
    def noise(self) -> float:
        """Half the width of the interval, in the units of `change`: the measured noise."""
        return (self.change_high - self.change_low) / 2

    @property
    def significant(self) -> bool:
        return self.change_low > 0 or self.change_high < 0


def _as_runs(side: Sequence[Sequence[float]] | Sequence[float]) -> list[np.ndarray]:
    """Accept one run (a flat sequence of numbers) or several (a sequence of sequences)."""
    if len(side) and np.ndim(side[0]) == 0:
        side = [side]  # type: ignore[list-item]
    runs = [np.asarray(r, dtype=float) for r in side]
    runs = [r[np.isfinite(r)] for r in runs]
    return [r for r in runs if r.size]


def block_length(n: int) -> int:
    return max(1, math.ceil(n ** (1 / 3)))


def block_resample(values: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(resamples, n) moving-block bootstrap resamples of one run, step order respected inside blocks."""
    n = values.size
    length = min(block_length(n), n)
    blocks = math.ceil(n / length)
    starts = rng.integers(0, n - length + 1, size=(resamples, blocks))
    idx = (starts[:, :, None] + np.arange(length)[None, None, :]).reshape(resamples, blocks * length)[:, :n]
    return values[idx]


def _side_stats(runs: list[np.ndarray], statistic: Callable, resamples: int,
                rng: np.random.Generator) -> tuple[float, np.ndarray, float | None]:
    """(point statistic, bootstrap distribution, relative run-to-run spread) for one side."""
    per_run = np.array([float(statistic(r[None, :], axis=1)[0]) for r in runs])
    boot = np.stack([statistic(block_resample(r, resamples, rng), axis=1) for r in runs])  # (k, B)
    k = len(runs)
    if k > 1:
        pick = rng.integers(0, k, size=(resamples, k))
        dist = boot[pick, np.arange(resamples)[:, None]].mean(axis=1)
        mean = float(per_run.mean())
        spread = float(per_run.std(ddof=1) / abs(mean)) if mean else None
    else:
        dist = boot[0]
        spread = None
    return float(per_run.mean()), dist, spread


def segment(runs: list[np.ndarray], segments: int = SEGMENTS) -> list[np.ndarray]:
    """One run -> ``segments`` contiguous pieces (when long enough); several runs stay as they are."""
    if len(runs) != 1 or segments < 2:
        return runs
    r = runs[0]
    k = min(segments, r.size // MIN_SEGMENT)
    if k < 2:
        return runs
    return [x for x in np.array_split(r, k) if x.size]


def compare(a, b, *, kind: str = "ratio", statistic: Callable = np.median,
            confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
            seed: int = 0, segments: int = SEGMENTS) -> Effect | None:
    """The effect of B against A with a bootstrap confidence interval.

    ``a`` and ``b`` are one run (a list of per-step values) or several (a list of such lists).
    Returns None when a side has fewer than :data:`MIN_STEPS` values in all (no honest interval), or
    when a ratio is asked of a side whose statistic is 0.
    """
    if kind not in ("ratio", "diff"):
        raise ValueError(f"kind must be 'ratio' or 'diff', not {kind!r}")
    runs_a, runs_b = _as_runs(a), _as_runs(b)
    n_a = sum(r.size for r in runs_a)
    n_b = sum(r.size for r in runs_b)
    if n_a < MIN_STEPS or n_b < MIN_STEPS:
        return None
    rng = np.random.default_rng(seed)
    sa, da, spread_a = _side_stats(segment(runs_a, segments), statistic, resamples, rng)
    sb, db, spread_b = _side_stats(segment(runs_b, segments), statistic, resamples, rng)
    if len(runs_a) == 1:
        spread_a = None
    if len(runs_b) == 1:
        spread_b = None
    if len(runs_a) == 1 and len(runs_b) == 1:
        # the point estimate stays the plain statistic of each run
        sa = float(statistic(runs_a[0][None, :], axis=1)[0])
        sb = float(statistic(runs_b[0][None, :], axis=1)[0])
    if kind == "ratio":
        if sa <= 0 or sb < 0 or np.any(da <= 0):
            return None
        est = sb / sa
        dist = db / da
    else:
        est = sb - sa
        dist = db - da
    alpha = (1 - confidence) / 2
    low, high = np.quantile(dist, [alpha, 1 - alpha])
    notes = []
    between = _between_runs(runs_a, runs_b, statistic, kind, confidence, sa, sb)
    if between is not None:
        # repeats: the bootstrap over a handful of runs is far too narrow when runs differ by a lot (a
        # shared machine: 24 runs of one script took 67-691 ms a step); the small-sample (Welch t)
        # interval over the runs' own statistics holds that variance. The wider of the two is kept.
        low, high = min(float(low), between[0]), max(float(high), between[1])
    if min(n_a, n_b) < 10:
        notes.append(f"few steps ({min(n_a, n_b)} on the smaller side): the interval is wide")
    # the percentile interval must contain the point estimate (it can miss it with very few values)
    low, high = min(float(low), est), max(float(high), est)
    return Effect(a=sa, b=sb, kind=kind, estimate=float(est), low=low, high=high,
                  confidence=confidence, n_a=n_a, n_b=n_b, runs_a=len(runs_a), runs_b=len(runs_b),
                  run_spread_a=spread_a, run_spread_b=spread_b, notes=notes)


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile (no scipy): exact for 1 and 2 degrees of freedom, Cornish-Fisher above."""
    import math
    from statistics import NormalDist

    df = max(float(df), 1.0)
    if df < 1.5:
        return math.tan(math.pi * (p - 0.5))
    if df < 2.5:
        return (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))
    z = NormalDist().inv_cdf(p)
    return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))


def _between_runs(runs_a, runs_b, statistic, kind, confidence, sa, sb) -> tuple[float, float] | None:
    """The interval of the effect (B/A for ratios, B-A for diffs) from the runs' own statistics, one per
    run, with Welch's t: the between-run variance, which resampling inside a few runs misses. A side
    with one run borrows the other side's variance. None with fewer than two runs on both sides."""
    if len(runs_a) < 2 and len(runs_b) < 2:
        return None
    xa = np.array([float(statistic(r[None, :], axis=1)[0]) for r in runs_a])
    xb = np.array([float(statistic(r[None, :], axis=1)[0]) for r in runs_b])
    if kind == "ratio":
        if np.any(xa <= 0) or np.any(xb <= 0):
            return None
        xa, xb = np.log(xa), np.log(xb)
    va = float(np.var(xa, ddof=1)) if xa.size >= 2 else None
    vb = float(np.var(xb, ddof=1)) if xb.size >= 2 else None
    va = vb if va is None else va
    vb = va if vb is None else vb
    qa, qb = va / xa.size, vb / xb.size
    se = float(np.sqrt(qa + qb))
    if se <= 0:
        return None
    den = (qa ** 2 / (xa.size - 1) if xa.size > 1 else 0.0) + (qb ** 2 / (xb.size - 1) if xb.size > 1 else 0.0)
    df = (qa + qb) ** 2 / den if den > 0 else max(xa.size + xb.size - 2, 1)
    t = t_quantile(1 - (1 - confidence) / 2, df)
    d = float(xb.mean() - xa.mean())
    if kind == "ratio":
        return float(np.exp(d - t * se)), float(np.exp(d + t * se))
    return d - t * se, d + t * se


def mean_share(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Statistic for shares (0..1 per step): their mean."""
    return np.mean(values, axis=axis)


def verdict(effect: Effect | None, threshold: float | None, higher_is_better: bool = False) -> str:
    """One of: ``regression`` (the whole interval is worse than the threshold), ``worse``
    (significantly worse, not beyond the threshold or no threshold), ``improved`` (significantly
    better), ``unchanged`` (the interval contains no change), ``unknown`` (no interval).

    ``threshold`` is in the units of :attr:`Effect.change` (0.05 = 5% for ratios)."""
    if effect is None:
        return "unknown"
    worse_low = -effect.change_high if higher_is_better else effect.change_low
    better_high = -effect.change_low if higher_is_better else effect.change_high
    if worse_low > 0:
        if threshold is not None and worse_low > threshold:
            return "regression"
        return "worse"
    if better_high < 0:
        return "improved"
    return "unchanged"
