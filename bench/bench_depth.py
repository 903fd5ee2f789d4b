"""The probe's cost against model depth (issue 20): steps of nn.Sequential(Linear(32, 32), ReLU, ...)
with 10, 100, 800 and 1,000 module calls per forward (batch 16) and the MLP workload, one intra-op
thread (bench/workloads/depth_steps.py). Two measurements per depth, on the step thread's CPU time
(it leaves out the time the thread waited for a core, which on a shared machine is most of the noise):

* **steady state** (the headline: what a long job pays): one probe installed for thousands of steps,
  steps in cycles of seven (three active, two paused, two with the probe taken out of torch), adjacent
  steps compared inside one process: the probe's work (active - paused), the floor of its hooks
  (paused - bare) and the total (active - bare), 10%-trimmed means with the spread over 10 chunks of
  cycles; and the total's growth per extra module call between the shallowest and deepest Sequential.
  At 801 calls the same measurement is also run in 8 separate processes: each process's memory layout
  moves the figure by more than its own spread shows, and the headline is the median over processes.
* **a fresh probe's first steps**: alternated blocks of 30 steps (after 6 warm-up steps), bare and
  under a probe installed for the block; the median overhead with its IQR. It includes what a probe
  pays once (discovery windows, the blocks' 8-batch epochs reopening them) and moves with the memory
  layout each block's allocations leave (a few percent at depth on a shared VM).

    .venv/bin/python bench/run.py depth                     # full sweep (README figures, ~16 min)
    BENCH_QUICK=1 .venv/bin/python bench/run.py depth       # smoke: 10 and 100 calls, a few seconds
    .venv/bin/python bench/bench_depth.py --calls 800 --rounds 2 --steps 4 --steady 1000   # one depth, steady
    .venv/bin/python bench/bench_depth.py --calls 800 --processes 8 --steady 400   # steady, median of 8 processes
    .venv/bin/python bench/bench_depth.py --quick --variants bare,hooks,probe,probe-noext,probe-global,probe-paused
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "bench" / "workloads" / "depth_steps.py"

FULL = {"calls": "10,100,800,1000,mlp", "rounds": 10, "steps": 30, "steady": 400,
        "processes": 8, "process_calls": "800"}
QUICK = {"calls": "10,100", "rounds": 3, "steps": 8, "steady": 40, "processes": 2, "process_calls": "100"}


def measure(calls: str, variants: str, rounds: int, steps: int, warmup: int = 6, timeout: float = 1800,
            steady: int = 0, loss: str = "functional") -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, str(WORKLOAD), "--calls", calls, "--variants", variants, "--rounds", str(rounds),
           "--steps", str(steps), "--warmup", str(warmup), "--steady", str(steady), "--loss", loss]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"depth workload failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _side(vals: list, base: list, calls: int) -> dict:
    ratios = [p / b - 1 for p, b in zip(vals, base)]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    per_call = [(p - b) * 1e6 / calls for p, b in zip(vals, base)]
    return {
        "step_median_ms": round(1000 * statistics.median(vals), 3),
        "overhead_median_pct": round(100 * statistics.median(ratios), 2),
        "overhead_iqr_pct": [round(100 * q[0], 2), round(100 * q[2], 2)],
        "us_per_module_call": round(statistics.median(per_call), 3),
        "pairs": len(ratios),
    }


def summarise(raw: dict) -> dict:
    """Per depth and per variant (against bare): medians, overhead median and IQR, us per call, on
    the thread's CPU time (the headline: insensitive to waiting for a core) and on the wall clock."""
    res = {}
    for calls, d in raw.items():
        wall, cpu = d["block_median_step_s"], d["block_median_step_cpu_s"]
        row = {"module_calls": d["module_calls"],
               "bare_step_median_ms": round(1000 * statistics.median(cpu["bare"]), 3),
               "bare_step_median_wall_ms": round(1000 * statistics.median(wall["bare"]), 3)}
        for v in wall:
            if v == "bare":
                continue
            row[v] = _side(cpu[v], cpu["bare"], d["module_calls"])
            row[v]["wall"] = _side(wall[v], wall["bare"], d["module_calls"])
            nowin = d.get("block_median_step_cpu_s_outside_windows", {}).get(v)
            if nowin:
                # the same pairs without the steps a discovery window covered: the steady per-step cost
                row[v]["outside_windows"] = _side(nowin, cpu["bare"], d["module_calls"])
                row[v]["outside_windows"]["window_steps_per_block"] = statistics.median(d["window_steps_per_block"][v])
            if v in d.get("probe_steps_seen", {}):
                row[v]["steps_recorded"] = d["probe_steps_seen"][v]
            own = d.get("probe_s_self", {}).get(v)
            if own:
                # what the probe said it cost (its probe_s), as a share of the bare step's wall time
                row[v]["self_reported_us"] = round(1e6 * statistics.median(own), 2)
                row[v]["self_reported_pct"] = round(100 * statistics.median(own) / statistics.median(wall["bare"]), 3)
        st = d.get("steady")
        if st:
            row["steady"] = steady_row(st, d["module_calls"])
        res[calls] = row
    return res


def steady_row(st: dict, calls: int) -> dict:
    """The steady-state figures (depth_steps.steady): the probe's work (active - paused), the floor
    under it (paused - bare) and the total (active - bare), adjacent steps of one process; trimmed
    means (medians alongside), the spread over chunks of cycles."""
    base = st["bare_step_s"]
    out = {"pairs": st["pairs"], "bare_step_ms": round(1000 * base, 3),
           "self_reported_us": round(1e6 * st["self_reported_s"], 1) if st.get("self_reported_s") else None,
           "windows": st.get("windows"), "cycles_touched_by_windows": st.get("cycles_touched_by_windows")}
    for part in ("work", "floor", "total"):
        v = st[f"{part}_s"]
        chunks = sorted(c / base for c in st["chunk_means_s"][part])
        q = statistics.quantiles(chunks, n=4) if len(chunks) >= 2 else [chunks[0]] * 3
        out[f"{part}_us"] = round(1e6 * v, 1)
        out[f"{part}_pct"] = round(100 * v / base, 2)
        out[f"{part}_chunk_iqr_pct"] = [round(100 * q[0], 2), round(100 * q[2], 2)]
        out[f"{part}_median_us"] = round(1e6 * st["median_s"][part], 1)
        if st.get("mean_s"):
            out[f"{part}_mean_us"] = round(1e6 * st["mean_s"][part], 2)
    return out


def per_call_slope(res: dict) -> float | None:
    """Microseconds of probe cost per extra module call: the steady total (or work) between the
    shallowest and the deepest Sequential of the sweep. Flat in depth: ~0."""
    pts = []
    for row in res.values():
        st = row.get("steady")
        if st and isinstance(row.get("module_calls"), int) and row["module_calls"] > 6:
            pts.append((row["module_calls"], st["total_us"]))
    if len(pts) < 2:
        return None
    pts.sort()
    (c0, u0), (c1, u1) = pts[0], pts[-1]
    return round((u1 - u0) / (c1 - c0), 3)


def across_processes(calls: str, processes: int, pairs: int, timeout: float = 1800, loss: str = "functional") -> dict:
    """The steady measurement at one depth in ``processes`` separate processes. Each process's memory
    layout is its own, and at depth it moves the probe's steady cost by more than the spread inside
    one process shows (at 801 calls, 0.1% to 1.6% of a step between processes of one hour): the
    headline is the median over processes, with their range and IQR."""
    rows = []
    for _ in range(processes):
        raw = measure(calls, "bare", 1, 2, steady=pairs, timeout=timeout, loss=loss)
        d = next(iter(raw.values()))
        rows.append(steady_row(d["steady"], d["module_calls"]))
    out = {"processes": len(rows), "pairs_each": pairs, "module_calls": next(iter(raw.values()))["module_calls"]}
    for part in ("total", "work", "floor"):
        pcts = sorted(r[f"{part}_pct"] for r in rows)
        q = statistics.quantiles(pcts, n=4) if len(pcts) >= 2 else [pcts[0]] * 3
        out[f"{part}_pct_median"] = round(statistics.median(pcts), 2)
        out[f"{part}_pct_iqr"] = [round(q[0], 2), round(q[2], 2)]
        out[f"{part}_pct_range"] = [pcts[0], pcts[-1]]
        out[f"{part}_us_median"] = round(statistics.median(r[f"{part}_us"] for r in rows), 1)
    selfs = [r["self_reported_us"] for r in rows if r.get("self_reported_us")]
    out["self_reported_us_median"] = round(statistics.median(selfs), 1) if selfs else None
    out["bare_step_ms_median"] = round(statistics.median(r["bare_step_ms"] for r in rows), 3)
    out["per_process"] = rows
    return out


def print_processes(p: dict) -> None:
    print(f"   {p['module_calls']:4d} calls, STEADY over {p['processes']} processes ({p['pairs_each']} cycles each), "
          f"bare step {p['bare_step_ms_median']:.3f} ms: "
          + ", ".join(f"{k} {p[k + '_pct_median']:+.2f}% (IQR {p[k + '_pct_iqr'][0]:+.2f}..{p[k + '_pct_iqr'][1]:+.2f}%, "
                      f"range {p[k + '_pct_range'][0]:+.2f}..{p[k + '_pct_range'][1]:+.2f}%)"
                      for k in ("total", "work", "floor"))
          + f" | self-reported {p['self_reported_us_median']} us", flush=True)


def print_table(res: dict) -> None:
    for calls, row in res.items():
        for v, r in row.items():
            if not isinstance(r, dict) or v == "steady":
                continue
            w = r["wall"]
            print(f"   {calls:>5} ({row['module_calls']:4d} calls) {v:11s} CPU {row['bare_step_median_ms']:8.3f} -> "
                  f"{r['step_median_ms']:8.3f} ms {r['overhead_median_pct']:+6.2f}% "
                  f"(IQR {r['overhead_iqr_pct'][0]:+.2f}..{r['overhead_iqr_pct'][1]:+.2f}%) "
                  f"{r['us_per_module_call']:+.3f} us/call | wall {row['bare_step_median_wall_ms']:.3f} -> "
                  f"{w['step_median_ms']:.3f} ms {w['overhead_median_pct']:+.2f}% "
                  f"(IQR {w['overhead_iqr_pct'][0]:+.2f}..{w['overhead_iqr_pct'][1]:+.2f}%) [{r['pairs']} pairs]"
                  + (f" | self-reported {r['self_reported_us']} us/step ({r['self_reported_pct']}%)"
                     if "self_reported_us" in r else "")
                  + (f" | outside windows {r['outside_windows']['overhead_median_pct']:+.2f}% "
                     f"(IQR {r['outside_windows']['overhead_iqr_pct'][0]:+.2f}..{r['outside_windows']['overhead_iqr_pct'][1]:+.2f}%)"
                     f" {r['outside_windows']['us_per_module_call']:+.3f} us/call, "
                     f"{r['outside_windows']['window_steps_per_block']:g} window steps a block"
                     if "outside_windows" in r else ""),
                  flush=True)
        st = row.get("steady")
        if st:
            print(f"   {calls:>5} ({row['module_calls']:4d} calls) STEADY      bare step {st['bare_step_ms']:.3f} ms: "
                  + ", ".join(f"{p} {st[p + '_pct']:+.2f}% ({st[p + '_us']:+.1f} us; chunk IQR "
                              f"{st[p + '_chunk_iqr_pct'][0]:+.2f}..{st[p + '_chunk_iqr_pct'][1]:+.2f}%)"
                              for p in ("total", "work", "floor"))
                  + f" [{st['pairs']} cycles] | self-reported {st['self_reported_us']} us", flush=True)
    slope = per_call_slope(res)
    if slope is not None:
        print(f"   steady-state cost per extra module call (deepest vs shallowest Sequential): {slope:+.3f} us", flush=True)


def run(results: dict, quick: bool | None = None, variants: str = "bare,probe") -> None:
    if quick is None:
        quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    cfg = QUICK if quick else FULL
    res = summarise(measure(cfg["calls"], variants, cfg["rounds"], cfg["steps"], warmup=3 if quick else 6,
                            steady=cfg["steady"]))
    results["mode"] = "quick" if quick else "full"
    results["depths"] = res
    results["steady_us_per_extra_module_call"] = per_call_slope(res)
    print_table(res)
    if cfg.get("processes"):
        results["steady_across_processes"] = across_processes(cfg["process_calls"], cfg["processes"], cfg["steady"])
        print_processes(results["steady_across_processes"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--variants", default="bare,probe")
    ap.add_argument("--calls", help="override the depths, e.g. 800 or 10,100,mlp")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--steady", type=int, help="pairs of the steady-state measurement (0: none)")
    ap.add_argument("--processes", type=int, help="also run the steady measurement in this many separate "
                    "processes at the first depth of --calls and report the median over them")
    ap.add_argument("--loss", choices=("functional", "module"), default="functional",
                    help="the step's loss: nn.functional.cross_entropy (default), or an nn.CrossEntropyLoss "
                    "module, as many scripts call it (the probe hooks it too: docs/performance.md, tenth pass)")
    a = ap.parse_args()
    if a.processes:
        calls = (a.calls or "800").split(",")[0]
        p = across_processes(calls, a.processes, a.steady or FULL["steady"], loss=a.loss)
        print_processes(p)
        print(json.dumps(p, indent=2))
        return 0
    cfg = dict(QUICK if a.quick else FULL)
    for k in ("calls", "rounds", "steps", "steady"):
        if getattr(a, k) is not None:
            cfg[k] = getattr(a, k)
    if "bare" not in a.variants.split(","):
        a.variants = "bare," + a.variants
    res = summarise(measure(cfg["calls"], a.variants, cfg["rounds"], cfg["steps"], warmup=3 if a.quick else 6,
                            steady=cfg["steady"], loss=a.loss))
    print_table(res)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
