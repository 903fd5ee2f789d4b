"""What the performance checklist's probe extension (diag/probe/perf/) adds to a training step.

Two measurements, both in this process with the core probe installed:
- A/B: the same tiny training loop with the core probe alone and with the core probe plus
  PerfProbe, alternated in blocks; the per-step difference is the extension's cost (a tiny model
  makes the step short, so the absolute difference is what matters; it is then expressed as a
  share of a 5 ms and a 20 ms step, the budget's range).
- The cost of the extension's per-step hooks called directly (on_forward + on_step_end), and of
  its wrapped calls (nn.Module.zero_grad, GradScaler.scale/step).
"""
from __future__ import annotations

import statistics
import time


def _loop(steps: int, model, opt, x, y, torch):
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def ab(results: dict, blocks: int = 15, steps: int = 200) -> None:
    import torch
    from torch import nn

    from diag.probe.core import Probe
    from diag.probe.perf import PerfProbe

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 32), torch.randint(0, 2, (16,))
    events = []
    per = {False: [], True: []}
    for i in range(blocks * 2):
        with_ext = bool(i % 2)
        probe = Probe(events.append, extensions=[PerfProbe()] if with_ext else [])
        probe.install()
        try:
            _loop(20, model, opt, x, y, torch)           # warm-up, first-step work
            per[with_ext].append(_loop(steps, model, opt, x, y, torch))
        finally:
            probe.uninstall()
        events.clear()
    base, ext = statistics.median(per[False]), statistics.median(per[True])
    diffs = [b - a for a, b in zip(per[False], per[True])]
    d = statistics.median(diffs)
    results["ab_step_core_probe_us"] = round(base * 1e6, 1)
    results["ab_step_core_plus_perf_us"] = round(ext * 1e6, 1)
    results["ab_perf_extension_us_per_step"] = round(d * 1e6, 2)
    results["ab_share_of_5ms_step_pct"] = round(100 * d / 0.005, 3)
    results["ab_share_of_20ms_step_pct"] = round(100 * d / 0.020, 3)
    q = statistics.quantiles(diffs, n=4) if len(diffs) >= 4 else [d, d, d]
    results["ab_paired_diff_iqr_us"] = [round(q[0] * 1e6, 1), round(q[2] * 1e6, 1)]
    print(f"   tiny step {base * 1e6:.0f} us with the core probe, {ext * 1e6:.0f} us with PerfProbe too: "
          f"{d * 1e6:.1f} us per step = {100 * d / 0.005:.2f}% of a 5 ms step "
          f"(paired differences, inter-quartile range {q[0] * 1e6:.0f}..{q[2] * 1e6:.0f} us)")


def hooks(results: dict, n: int = 20000) -> None:
    import torch
    from torch import nn

    from diag.probe.core import Probe
    from diag.probe.perf import PerfProbe

    events = []
    ext = PerfProbe()
    probe = Probe(events.append, extensions=[ext])
    probe.install()
    try:
        model = nn.Sequential(nn.Linear(8, 8))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(2, 8)
        loss = model(x).sum()          # opens a step; the probe knows the model
        loss.backward()
        opt.step()
        model(x)
        out = model(x)
        st = probe.current_step
        t0 = time.perf_counter()
        for _ in range(n):
            st.n_forward = 1
            ext.on_forward(probe, model, (x,), {}, out, True)
        fwd = (time.perf_counter() - t0) / n
        step = {"index": 3, "extra": {}}
        t0 = time.perf_counter()
        for _ in range(n):
            ext.on_step_end(probe, step)
        ext._dirty.clear()
        end = (time.perf_counter() - t0) / n
        wrapped = nn.Module.zero_grad
    finally:
        probe.uninstall()
    plain = nn.Module.zero_grad
    mz, mz0 = [], []
    for _ in range(7):                 # interleaved rounds: the wrapper against the original
        for fn, acc in ((wrapped, mz), (plain, mz0)):
            t0 = time.perf_counter()
            for _ in range(n // 20):
                fn(model)
            acc.append((time.perf_counter() - t0) / (n // 20))
    # the wrapper only times and counts while the probe is live; measure it live:
    probe = Probe(events.append, extensions=[ext])
    probe.install()
    try:
        wrapped = nn.Module.zero_grad
        mz = []
        for _ in range(7):
            t0 = time.perf_counter()
            for _ in range(n // 20):
                wrapped(model)
            mz.append((time.perf_counter() - t0) / (n // 20))
    finally:
        probe.uninstall()
    mz, mz0 = statistics.median(mz), statistics.median(mz0)
    results["hook_on_forward_us"] = round(fwd * 1e6, 3)
    results["hook_on_step_end_us"] = round(end * 1e6, 3)
    results["module_zero_grad_wrapper_us"] = round((mz - mz0) * 1e6, 3)
    per_step = fwd + end + max(mz - mz0, 0)
    results["hooks_per_step_us"] = round(per_step * 1e6, 3)
    results["hooks_share_of_5ms_step_pct"] = round(100 * per_step / 0.005, 4)
    print(f"   on_forward {fwd * 1e6:.2f} us, on_step_end {end * 1e6:.2f} us, zero_grad wrapper "
          f"{(mz - mz0) * 1e6:.2f} us: {per_step * 1e6:.2f} us per step = {100 * per_step / 0.005:.3f}% of 5 ms")


def run(results: dict) -> None:
    hooks(results)
    ab(results)


if __name__ == "__main__":
    import json
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    res: dict = {}
    run(res)
    print(json.dumps(res, indent=2))
