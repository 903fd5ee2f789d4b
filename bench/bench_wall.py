"""The probe's cost on the script's own wall clock (issue 28, docs/performance.md "Tenth pass"): the
same training script (bench/workloads/wall_steps.py) run in separate processes, bare and under
``python -m diag.probe`` (what ``diag check`` starts: the default extensions, the file sink and its
writer thread), in alternated rounds (the order rotates each round so drift hits every side). Each
run prints its mean step time over the steps after its warm-up, measured by the script itself with
``time.perf_counter``: everything the probe costs the step's thread, the writer thread's share of the
GIL included (the CPU-time benchmark, bench_depth.py --steady, leaves that out). Beside it, the CPU
a step added on the step's thread and on the process's other threads (the event writer).

Sides: ``bare``; ``probe``; ``probe-nolane`` (DIAG_PROBE_LANE=0: every step on the full path).

    .venv/bin/python bench/bench_wall.py --calls 10 --steps 4000 --rounds 4
    .venv/bin/python bench/bench_wall.py --calls 100 --steps 3000 --rounds 4 --sides bare,probe,probe-nolane
    .venv/bin/python bench/bench_wall.py --calls 10 --data tensors --sides bare,probe,probe-nolane   # no DataLoader
    .venv/bin/python bench/bench_wall.py --calls 10 --accum 4 --steps 1500   # gradient accumulation, 4 micro-batches
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORKLOAD = HERE / "workloads" / "wall_steps.py"
SIDES = ("bare", "probe", "probe-nolane")


def run_side(side: str, args: list, tmp: str, k: int) -> tuple:
    """One run of the workload on ``side``: its mean step time (seconds) and, under the probe, how many
    step events the probe wrote (proof it was installed and timed the steps)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    events = os.path.join(tmp, f"{side}-{k}.jsonl")
    if side == "bare":
        cmd = [sys.executable, str(WORKLOAD), *args]
    else:
        env["DIAG_EVENTS"] = events
        env["DIAG_PROBE_LANE"] = "0" if side == "probe-nolane" else "1"
        cmd = [sys.executable, "-m", "diag.probe", str(WORKLOAD), *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
    if out.returncode != 0:
        raise SystemExit(f"bench_wall: the {side} run failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
    steps = 0
    if side != "bare":
        with open(events, encoding="utf-8") as f:
            steps = sum(1 for ln in f if '"kind": "step"' in ln)
    got = json.loads(line)
    return (float(got["mean_step_s"]), steps, got["thread_cpu_step_s"], got["process_cpu_step_s"],
            got["p999_step_s"], got["max_step_s"])


def measure(calls: int, steps: int, warm: int, rounds: int, sides: list, log=print, data: str = "loader",
            accum: int = 1) -> dict:
    """Alternated rounds of every side; per probe side, the added time a step (median and range over the
    rounds, against the same round's bare run) and the step events each run wrote."""
    args = ["--calls", str(calls), "--steps", str(steps), "--warm", str(warm), "--data", data, "--accum", str(accum)]
    got: dict = {s: [] for s in sides}
    recorded: dict = {s: [] for s in sides}
    cpu: dict = {s: [] for s in sides}
    tail: dict = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="diag-bench-wall-") as tmp:
        for r in range(rounds):
            order = sides[r % len(sides):] + sides[:r % len(sides)]
            row = {}
            for s in order:
                row[s], n, th, pr, p999, longest = run_side(s, args, tmp, r)
                got[s].append(row[s])
                tail[s].append((p999, longest))
                cpu[s].append((th, pr))
                recorded[s].append(n)
            log(f"round {r + 1}: " + ", ".join(f"{s} {row[s] * 1e6:.1f} us" for s in sides)
                + "".join(f"; {s} {(row[s] - row['bare']) * 1e6:+.1f} us ({row[s] / row['bare'] - 1:+.1%})"
                          for s in sides[1:]))
    summary: dict = {"calls": calls, "data": data, "accum": accum, "steps": steps, "rounds": rounds,
                     "bare_us": [round(x * 1e6, 1) for x in got["bare"]],
                     # the longest steps of each run (its 99.9th percentile, its longest), per round
                     "bare_tail_us": [[round(a * 1e6), round(b * 1e6)] for a, b in tail["bare"]]}
    for s in sides[1:]:
        diffs = [(p - b) * 1e6 for p, b in zip(got[s], got["bare"])]
        ratios = [(p / b - 1) * 100 for p, b in zip(got[s], got["bare"])]
        summary[s] = {"added_us_median": round(statistics.median(diffs), 1),
                      "added_us_range": [round(min(diffs), 1), round(max(diffs), 1)],
                      "added_pct_median": round(statistics.median(ratios), 2),
                      "added_pct_range": [round(min(ratios), 2), round(max(ratios), 2)],
                      "steps_recorded": recorded[s],
                      "tail_us": [[round(a * 1e6), round(b * 1e6)] for a, b in tail[s]],
                      # CPU a step against the same round's bare run: the step's thread, and the other
                      # threads (the process's CPU beyond its step thread: the event writer)
                      "thread_cpu_added_us_median": round(statistics.median(
                          (c[0] - b[0]) * 1e6 for c, b in zip(cpu[s], cpu["bare"])), 1),
                      "other_threads_cpu_added_us_median": round(statistics.median(
                          ((c[1] - c[0]) - (b[1] - b[0])) * 1e6 for c, b in zip(cpu[s], cpu["bare"])), 1)}
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10, help="module calls a forward (the depth sweep's model)")
    ap.add_argument("--steps", type=int, default=4000, help="steps each run times, after --warm")
    ap.add_argument("--warm", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--data", choices=("loader", "tensors"), default="loader",
                    help="the loop's batches: from a DataLoader, or sliced from tensors by the loop (no DataLoader)")
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches a step (gradient accumulation: each fetched, forwarded and backpropagated)")
    ap.add_argument("--sides", default="bare,probe", help=f"comma-separated, of {', '.join(SIDES)}; bare first")
    a = ap.parse_args()
    sides = [s for s in a.sides.split(",") if s]
    if any(s not in SIDES for s in sides) or not sides or sides[0] != "bare" or len(sides) < 2:
        print(f"bench_wall: --sides must start with bare and name at least one more of {', '.join(SIDES)}",
              file=sys.stderr)
        return 2
    if a.steps < 2 or a.warm < 0 or a.rounds < 1 or a.accum < 1:
        print("bench_wall: --steps must be at least 2, --rounds and --accum at least 1, --warm not negative",
              file=sys.stderr)
        return 2
    summary = measure(a.calls, a.steps, a.warm, a.rounds, sides, log=lambda m: print(m, flush=True), data=a.data,
                      accum=a.accum)
    for s in sides[1:]:
        r = summary[s]
        print(f"{s}: {r['added_us_median']:+.1f} us a step median (range {r['added_us_range'][0]:+.1f}.."
              f"{r['added_us_range'][1]:+.1f}), {r['added_pct_median']:+.2f}% (range {r['added_pct_range'][0]:+.2f}.."
              f"{r['added_pct_range'][1]:+.2f}%) over {a.rounds} rounds; CPU a step: step thread "
              f"{r['thread_cpu_added_us_median']:+.1f} us, other threads {r['other_threads_cpu_added_us_median']:+.1f} us; "
              f"longest steps (p99.9/max, us) {r['tail_us']} (bare {summary['bare_tail_us']})")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
