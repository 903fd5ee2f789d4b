"""Cost: `diag cost` wall time, engine speed, and what the FLOP counter adds to a training run.

The counter (diag.probe.flops) runs FlopCounterMode on one step. Measured in-process (diag.watch) on
tiny real models, with the extension on and off (DIAG_PROBE_DISABLE=flopcounter), alternating:
* the instrumented step's time vs the median step (the counter's own overhead, on that step only),
* the median of the other steps (must not change: no cost outside the instrumented step),
* the whole run's wall time.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _cli_ms(args: list[str], n: int = 5) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "diag", "cost", *args], capture_output=True, check=True, env=env)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _train(widths: tuple[int, int], batch: int, steps: int, flops_on: bool) -> dict:
    import torch
    from torch import nn

    import diag

    if flops_on:
        os.environ.pop("DIAG_PROBE_DISABLE", None)
    else:
        os.environ["DIAG_PROBE_DISABLE"] = "flopcounter"
    d, h = widths
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, d))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    xs = [torch.randn(batch, d) for _ in range(4)]
    t0 = time.perf_counter()
    with diag.watch(max_steps=steps) as run:
        for i in range(steps + 1):
            loss = model(xs[i % 4]).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    wall = time.perf_counter() - t0
    os.environ.pop("DIAG_PROBE_DISABLE", None)
    r = run.evidence.primary
    others = sorted(s.total_s for s in r.steps if not s.instrumented and s.index > 3)
    inst = [s.total_s for s in r.steps if s.instrumented]
    return {"wall_s": wall, "median_step_s": statistics.median(others), "q1_step_s": others[len(others) // 4],
            "instrumented_s": inst[0] if inst else None, "achieved": r.flops.get("achieved")}


def run(results: dict) -> None:
    from diag.cost import compare, estimate, load_catalog

    # `diag cost` end to end (python start-up included)
    results["cli_gpt3_ms"] = round(_cli_ms(["--params", "175e9", "--tokens", "300e9", "--gpu", "A100",
                                            "--count", "1024", "--mfu", "0.3"]), 1)
    results["cli_compare4_ms"] = round(_cli_ms(["--params", "7B", "--tokens", "1T", "--compare",
                                                "H100x8,A100x16,L40Sx32,MI300Xx8"]), 1)
    print(f"   diag cost (GPT-3): {results['cli_gpt3_ms']} ms; --compare of 4: {results['cli_compare4_ms']} ms")

    t0 = time.perf_counter()
    cat = load_catalog(user=False)
    results["load_catalog_ms"] = round((time.perf_counter() - t0) * 1000, 2)
    n = 2000
    t0 = time.perf_counter()
    for _ in range(n):
        estimate(7e9, 1e12, "H100", 8, 0.4, catalog=cat)
    results["estimate_us"] = round((time.perf_counter() - t0) / n * 1e6, 1)
    t0 = time.perf_counter()
    for _ in range(200):
        compare([g.id for g in cat if g.tflops], 7e9, 1e12, 8, 0.4, catalog=cat)
    results["compare_all_gpus_ms"] = round((time.perf_counter() - t0) / 200 * 1000, 3)
    print(f"   load_catalog {results['load_catalog_ms']} ms, estimate {results['estimate_us']} us, "
          f"compare over the whole catalogue {results['compare_all_gpus_ms']} ms")

    # the FLOP counter's cost, on two sizes of model (paired, alternating on/off, 3 rounds)
    # On a shared machine the run-to-run noise is large: the least disturbed figure is the smallest
    # lower-quartile step time over the rounds; the median of the runs' medians is reported beside it.
    for name, widths, batch, steps, rounds in (("mlp_small", (256, 512), 32, 60, 6),
                                               ("mlp_large", (1024, 2048), 32, 20, 3)):
        on, off = [], []
        _train(widths, batch, 5, True)      # warm-up (allocator, kernels)
        for _ in range(rounds):
            on.append(_train(widths, batch, steps, True))
            off.append(_train(widths, batch, steps, False))
        med_on = statistics.median(x["median_step_s"] for x in on)
        med_off = statistics.median(x["median_step_s"] for x in off)
        q1_on = min(x["q1_step_s"] for x in on)
        q1_off = min(x["q1_step_s"] for x in off)
        inst = statistics.median(x["instrumented_s"] for x in on)
        wall_on = statistics.median(x["wall_s"] for x in on)
        wall_off = statistics.median(x["wall_s"] for x in off)
        res = {
            "best_q1_step_ms_counter_on": round(q1_on * 1000, 3),
            "best_q1_step_ms_counter_off": round(q1_off * 1000, 3),
            "median_step_ms_counter_on": round(med_on * 1000, 3),
            "median_step_ms_counter_off": round(med_off * 1000, 3),
            "instrumented_step_ms": round(inst * 1000, 3),
            "instrumented_step_extra_ms": round((inst - med_on) * 1000, 3),
            "instrumented_step_ratio": round(inst / med_on, 2),
            "run_wall_s_counter_on": round(wall_on, 3),
            "run_wall_s_counter_off": round(wall_off, 3),
            "run_overhead_pct": round((wall_on / wall_off - 1) * 100, 1),
            "steps": steps,
        }
        results[name] = res
        print(f"   {name}: other steps {res['best_q1_step_ms_counter_off']} ms off / {res['best_q1_step_ms_counter_on']} ms on "
              f"(medians {res['median_step_ms_counter_off']} / {res['median_step_ms_counter_on']}); "
              f"instrumented step {res['instrumented_step_ms']} ms (+{res['instrumented_step_extra_ms']} ms, "
              f"x{res['instrumented_step_ratio']}); {steps}-step run {res['run_overhead_pct']}%")
