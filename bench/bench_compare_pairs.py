"""False-alarm rate of the CI gate (`diag compare` at its defaults) on same-code pairs, per runs-per-side
(issue 33: a gate that fails a PR on noise is switched off).

Runs a tiny workload (bench/workloads/mlp_steps.py, 60 CPU steps of a 512-1024-1024-10 MLP, the
makemore-sized loop that showed the false alarm) RUNS times under `diag check` — the same code every
time, one after the other on whatever load the machine has — and saves the reports. Then judges, at the
default 5% threshold and the default --min-runs, without running anything more:

* 1 vs 1: every ordered pair (i, j), i != j (both orders: "swapped" pairs included), at the default
  (one run per side is reported, not gated) and with --min-runs 1 (what the gate did before);
* 2 vs 2 and 3 vs 3 as `diag compare --runs k` runs them: 2k consecutive runs, interleaved (base, new,
  base, new, ...), every window of the sequence, each judged in both orders;
* for information, not the gate's schedule: the same sizes from random, non-interleaved splits of runs
  made minutes apart (a machine whose load changes 5x between the sides is a real difference the runs
  cannot tell from a regression: the reason --runs interleaves).

A false alarm is exit code 1. The figure goes in the README's CI section.

    .venv/bin/python bench/run.py compare_pairs                      # 48 runs (~10-25 min on 2 loaded cores)
    DIAG_BENCH_PAIRS_FROM=/tmp/dir .venv/bin/python bench/run.py compare_pairs   # re-judge saved reports
    DIAG_BENCH_PAIRS_RUNS=12 DIAG_BENCH_PAIRS_SPLITS=60 ...
"""
from __future__ import annotations

import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workloads" / "mlp_steps.py"


def _collect(tmp: Path, runs: int, steps: int) -> list[Path]:
    out = []
    for i in range(runs):
        rep = tmp / f"run{i}.json"
        if not rep.exists():
            cmd = [sys.executable, "-m", "diag", "check", "--script", str(WORKLOAD), "--format", "json", "-o", str(rep),
                   "--run-dir", str(tmp / f"run{i}"), "--fail-on", "never", "--", str(steps)]
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=900,
                           cwd=HERE.parent)
            print(f"   run {i + 1}/{runs}", flush=True)
        if rep.exists():
            out.append(rep)
    return out


def run(results: dict) -> None:
    sys.path.insert(0, str(HERE.parent))
    from diag.compare import extract
    from diag.compare.core import compare, parse_thresholds

    runs = int(os.environ.get("DIAG_BENCH_PAIRS_RUNS", "48"))
    steps = int(os.environ.get("DIAG_BENCH_PAIRS_STEPS", "60"))
    splits = int(os.environ.get("DIAG_BENCH_PAIRS_SPLITS", "30"))
    reuse = os.environ.get("DIAG_BENCH_PAIRS_FROM")
    tmp = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix="diag-bench-pairs-"))
    t0 = time.perf_counter()
    reports = sorted(_collect(tmp, runs, steps), key=lambda p: int(p.stem[3:]))
    samples = [extract.load(p) for p in reports]
    n = len(samples)
    thr = parse_thresholds(None)
    rng = random.Random(0)

    def judge(base, new, **kw):
        c = compare([samples[i] for i in base], [samples[i] for i in new], thresholds=thr, force=True,
                    resamples=500, **kw)
        return c.exit_code == 1, c.metric("step_time").change

    r = results
    r["reports"] = str(tmp)
    r["runs"] = n
    r["median_step_ms"] = [round(statistics.median(s.steps["total_s"]) * 1000, 2) for s in samples]
    ordered = [(i, j) for i in range(n) for j in range(n) if i != j]
    for label, kw in (("1v1_default", {}), ("1v1_min_runs_1", {"min_runs": 1})):
        alarms = [judge([i], [j], **kw) for i, j in ordered]
        r[f"{label}_pairs"] = len(alarms)
        r[f"{label}_false_alarms"] = sum(a for a, _ in alarms)
        changes = sorted(abs(c) for _, c in alarms if c is not None)
        if label == "1v1_default" and changes:
            r["1v1_abs_change_p50"] = round(changes[len(changes) // 2], 4)
            r["1v1_abs_change_max"] = round(changes[-1], 4)
        print(f"   {label}: {r[f'{label}_false_alarms']} false alarm(s) in {len(alarms)} ordered pairs", flush=True)
    for k in (2, 3):
        if n < 2 * k:
            continue
        alarms = []
        for start in range(n - 2 * k + 1):
            w = list(range(start, start + 2 * k))
            a, b = w[0::2], w[1::2]
            alarms.append(judge(a, b)[0])
            alarms.append(judge(b, a)[0])      # swapped
        r[f"{k}v{k}_pairs"] = len(alarms)
        r[f"{k}v{k}_false_alarms"] = sum(alarms)
        print(f"   {k}v{k} interleaved: {sum(alarms)} false alarm(s) in {len(alarms)} pairs (incl. swapped)", flush=True)
        alarms = []
        for _ in range(splits):
            pick = rng.sample(range(n), 2 * k)
            alarms.append(judge(pick[:k], pick[k:])[0])
            alarms.append(judge(pick[k:], pick[:k])[0])
        r[f"{k}v{k}_random_splits_pairs"] = len(alarms)
        r[f"{k}v{k}_random_splits_false_alarms"] = sum(alarms)
        print(f"   {k}v{k} random splits (not interleaved; information): {sum(alarms)} in {len(alarms)}", flush=True)
    total = sum(r.get(f"{x}_pairs", 0) for x in ("1v1_default", "2v2", "3v3"))
    alarms = sum(r.get(f"{x}_false_alarms", 0) for x in ("1v1_default", "2v2", "3v3"))
    r["default_gate_pairs"] = total
    r["default_gate_false_alarms"] = alarms
    r["default_gate_false_alarm_rate"] = round(alarms / total, 4) if total else None
    try:
        r["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    print(f"   default gate: {alarms} false alarm(s) in {total} same-code pairs", flush=True)


if __name__ == "__main__":
    import json

    res: dict = {}
    run(res)
    print(json.dumps(res, indent=2))
