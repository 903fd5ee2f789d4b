"""False-alarm rate of `diag compare` on same-code runs of a short real training run.

Runs the workload (default: diag's demo clean twin, diag/demo/clean.py, 3 epochs = 60 steps of
~10-40 ms on a CPU; DIAG_BENCH_COMPARE_WORKLOAD=mlp runs bench/workloads/mlp_steps.py instead) RUNS times under `diag check` (the same code every time), then
compares consecutive runs (RUNS - 1 comparisons, each one a CI job's "main vs PR" with no change)
and every pair (RUNS * (RUNS - 1) / 2), at the default 5% threshold. A false alarm is exit 1.
Also reports the measured noise (half-width of the step-time interval) and the raw change spread.

    .venv/bin/python bench/run.py compare                      # 21 runs of the clean twin
    DIAG_BENCH_COMPARE_RUNS=11 DIAG_BENCH_COMPARE_WORKLOAD=mlp DIAG_BENCH_COMPARE_STEPS=40 \
        .venv/bin/python bench/run.py compare
"""
from __future__ import annotations

import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = {"clean": (HERE.parent / "diag" / "demo" / "clean.py", lambda steps: ["--epochs", str(max(1, steps // 20))]),
             "mlp": (HERE / "workloads" / "mlp_steps.py", lambda steps: [str(steps)])}


def run(results: dict) -> None:
    sys.path.insert(0, str(HERE.parent))
    from diag.compare import extract
    from diag.compare.core import compare, parse_thresholds

    runs = int(os.environ.get("DIAG_BENCH_COMPARE_RUNS", "21"))
    workload = os.environ.get("DIAG_BENCH_COMPARE_WORKLOAD", "clean")
    steps = int(os.environ.get("DIAG_BENCH_COMPARE_STEPS", "60"))
    script, script_args = WORKLOADS[workload]
    reuse = os.environ.get("DIAG_BENCH_COMPARE_FROM")   # re-judge the reports of an earlier run
    tmp = Path(reuse) if reuse else Path(tempfile.mkdtemp(prefix="diag-bench-compare-"))
    samples = []
    t0 = time.perf_counter()
    for i in range(runs):
        out = tmp / f"run{i}.json"
        if reuse:
            samples.append(extract.load(out))
            continue
        cmd = [sys.executable, "-m", "diag", "check", "--script", str(script), "--format", "json",
               "-o", str(out), "--run-dir", str(tmp / f"run{i}"), "--fail-on", "never", "--",
               *script_args(steps)]
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, timeout=600)
        samples.append(extract.load(out))
        print(f"   run {i + 1}/{runs}: median step {statistics.median(samples[-1].steps['total_s']) * 1000:.1f} ms",
              flush=True)
    wall = time.perf_counter() - t0
    thr = parse_thresholds(None)

    def judge(pairs):
        alarms, changes, noise, significant = 0, [], [], 0
        for a, b in pairs:
            c = compare([samples[a]], [samples[b]], thresholds=thr, force=True, resamples=1000)
            m = c.metric("step_time")
            alarms += c.exit_code == 1
            significant += m.verdict in ("regression", "worse", "improved")
            changes.append(m.change)
            noise.append((m.high - m.low) / 2)
        return alarms, changes, noise, significant

    consecutive = [(i, i + 1) for i in range(runs - 1)]
    alarms, changes, noise, sig = judge(consecutive)
    all_alarms, all_changes, all_noise, all_sig = judge(list(itertools.combinations(range(runs), 2)))
    r = results
    r["reports"] = str(tmp)
    r["workload"] = workload
    r["runs"] = runs
    r["steps_per_run"] = steps
    r["wall_s"] = round(wall, 1)
    r["median_step_ms"] = [round(statistics.median(s.steps["total_s"]) * 1000, 2) for s in samples]
    r["consecutive_comparisons"] = len(consecutive)
    r["consecutive_false_alarms"] = alarms
    r["consecutive_significant_changes"] = sig
    r["consecutive_abs_change_median_pct"] = round(statistics.median(abs(x) for x in changes) * 100, 2)
    r["consecutive_abs_change_max_pct"] = round(max(abs(x) for x in changes) * 100, 2)
    r["consecutive_ci_half_width_median_pct"] = round(statistics.median(noise) * 100, 2)
    r["all_pairs_comparisons"] = len(all_changes)
    r["all_pairs_false_alarms"] = all_alarms
    r["all_pairs_significant_changes"] = all_sig
    r["all_pairs_abs_change_max_pct"] = round(max(abs(x) for x in all_changes) * 100, 2)
    r["all_pairs_ci_half_width_median_pct"] = round(statistics.median(all_noise) * 100, 2)
    # repeats: 3 runs per side from disjoint runs
    groups = [list(range(i, i + 3)) for i in range(0, runs - runs % 3, 3)]
    rep_alarms = rep_n = 0
    rep_noise = []
    for ga, gb in zip(groups[::2], groups[1::2]):
        c = compare([samples[i] for i in ga], [samples[i] for i in gb], thresholds=thr, force=True,
                    resamples=1000)
        m = c.metric("step_time")
        rep_n += 1
        rep_alarms += c.exit_code == 1
        rep_noise.append((m.high - m.low) / 2)
    r["repeats3_comparisons"] = rep_n
    r["repeats3_false_alarms"] = rep_alarms
    r["repeats3_ci_half_width_median_pct"] = round(statistics.median(rep_noise) * 100, 2) if rep_noise else None
    print(f"   same code, {len(consecutive)} consecutive comparisons: {alarms} false alarm(s) at 5% "
          f"(median |change| {r['consecutive_abs_change_median_pct']}%, max {r['consecutive_abs_change_max_pct']}%, "
          f"median noise ±{r['consecutive_ci_half_width_median_pct']}%); all {len(all_changes)} pairs: "
          f"{all_alarms} false alarm(s)", flush=True)


if __name__ == "__main__":
    import json

    res: dict = {}
    run(res)
    print(json.dumps(res, indent=2))
