"""The probe's cost: overhead on the steady-state step, `diag check` wall time vs the script's own,
`diag --help` time, time to the first finding."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "bench" / "workloads" / "mlp_steps.py"
PY = sys.executable


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    return e


def _median_step(with_probe: bool, tmp: str) -> float:
    env = _env()
    # one intra-op thread on both sides: two threads on a 2-core machine make the step time swing
    # by +-10% from run to run, which would drown a 1% effect
    env["OMP_NUM_THREADS"] = "1"
    if with_probe:
        env["DIAG_EVENTS"] = os.path.join(tmp, f"ev-{time.monotonic_ns()}.jsonl")
        cmd = [PY, "-m", "diag.probe", str(WORKLOAD), "300"]
    else:
        cmd = [PY, str(WORKLOAD), "300"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["median_step_s"]


def probe_overhead(results: dict, pairs: int = 20) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base, probed = [], []
        for i in range(pairs):           # paired and alternated, so drift hits both sides
            order = (False, True) if i % 2 == 0 else (True, False)
            for w in order:
                (probed if w else base).append(_median_step(w, tmp))
    ratios = [p / b - 1 for p, b in zip(probed, base)]
    results["step_median_without_diag_ms"] = round(1000 * statistics.median(base), 3)
    results["step_median_with_probe_ms"] = round(1000 * statistics.median(probed), 3)
    results["probe_overhead_median_pct"] = round(100 * statistics.median(ratios), 2)
    results["probe_overhead_pairs_pct"] = [round(100 * r, 2) for r in ratios]
    q = statistics.quantiles(ratios, n=4)
    results["probe_overhead_iqr_pct"] = [round(100 * q[0], 2), round(100 * q[2], 2)]
    print(f"   step {results['step_median_without_diag_ms']} ms -> {results['step_median_with_probe_ms']} ms "
          f"with the probe: overhead {results['probe_overhead_median_pct']}% (median of {pairs} pairs, "
          f"inter-quartile range {results['probe_overhead_iqr_pct'][0]}..{results['probe_overhead_iqr_pct'][1]}%)")


def check_wall(results: dict) -> None:
    demo = ROOT / "diag" / "demo" / "planted.py"
    with tempfile.TemporaryDirectory() as tmp:
        own, via = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([PY, str(demo)], capture_output=True, env=_env(), check=True)
            own.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            subprocess.run([PY, "-m", "diag", "check", "--script", str(demo), "--format", "json",
                            "--run-dir", os.path.join(tmp, f"r{len(via)}")], capture_output=True, env=_env())
            via.append(time.perf_counter() - t0)
    results["demo_script_wall_s"] = round(min(own), 2)
    results["demo_diag_check_wall_s"] = round(min(via), 2)
    results["demo_diag_check_extra_s"] = round(min(via) - min(own), 2)
    print(f"   demo: script alone {min(own):.2f} s, under diag check {min(via):.2f} s "
          f"(+{min(via) - min(own):.2f} s)")


def help_time(results: dict) -> None:
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([PY, "-m", "diag", "--help"], capture_output=True, env=_env(), check=True)
        ts.append(time.perf_counter() - t0)
    results["help_s"] = round(min(ts), 3)
    print(f"   diag --help: {min(ts):.3f} s")


def first_finding(results: dict) -> None:
    sys.path.insert(0, str(ROOT))
    from diag.registry import Registry
    from diag.runner import Run, RunConfig

    reg = Registry.discover()
    with tempfile.TemporaryDirectory() as tmp:
        run = Run(RunConfig(script=str(ROOT / "diag" / "demo" / "planted.py"), run_dir=os.path.join(tmp, "r"),
                            echo=None))
        t0 = time.perf_counter()
        run.start()
        first = None
        while run.running and first is None:
            time.sleep(0.05)
            fs = [f for f in reg.run(run.snapshot()) if f.severity.value in ("warning", "error")]
            if fs:
                first = time.perf_counter() - t0
                results["first_finding_id"] = fs[0].id
        run.stop()
        run.wait()
    results["time_to_first_finding_s"] = round(first, 2) if first else None
    print(f"   time to the first warning/error finding on the demo: {first:.2f} s "
          f"({results.get('first_finding_id')})" if first else "   no finding before the end")


def run(results: dict) -> None:
    help_time(results)
    probe_overhead(results)
    check_wall(results)
    first_finding(results)
