"""Workload of bench/bench_wall.py: a plain training loop, timed on its own clock, as a user's script
would time itself. nn.Sequential of Linear(32, 32) + ReLU pairs (about CALLS module calls a forward),
batch 16, SGD, cross-entropy, one DataLoader epoch (``--data tensors``: batches the loop slices from
two tensors itself, no DataLoader, as nanoGPT's ``get_batch`` does), one intra-op thread. Prints one
JSON line: the
mean wall-clock step time (``time.perf_counter`` at each step's end) over the steps after WARM, and
the CPU time a step of this thread and of the whole process (other threads included: the probe's
event writer), and the longest steps (the 99.9th percentile and the longest: a writer thread that holds
the GIL shows there, not in the mean).

    python bench/workloads/wall_steps.py --calls 10 --steps 4000 --warm 300
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--steps", type=int, default=4000, help="steps timed, after the warm-up")
    ap.add_argument("--warm", type=int, default=300, help="steps left out at the start")
    ap.add_argument("--data", choices=("loader", "tensors"), default="loader",
                    help="batches from a DataLoader, or sliced from two tensors by the loop itself")
    ap.add_argument("--accum", type=int, default=1,
                    help="micro-batches a step (gradient accumulation: fetch, forward, backward each; then the "
                         "optimizer step)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list = []
    for _ in range(max(1, a.calls // 2)):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers)
    n = (a.steps + a.warm) * 16 * a.accum
    xs, ys = torch.randn(n, 32), torch.randint(0, 32, (n,))
    if a.data == "loader":
        loader = DataLoader(TensorDataset(xs, ys), batch_size=16)
    else:
        loader = ((xs[i:i + 16], ys[i:i + 16]) for i in range(0, n, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    ends, cpu = [], []
    if a.accum == 1:
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            ends.append(time.perf_counter())
            if len(ends) in (a.warm + 1, a.warm + a.steps):
                cpu.append((time.thread_time(), time.process_time()))
    else:
        batches = iter(loader)
        for _ in range(a.warm + a.steps):
            opt.zero_grad()
            for _ in range(a.accum):       # one call site for every micro-batch, as accumulation loops are written
                x, y = next(batches)
                loss = loss_fn(model(x), y) / a.accum
                loss.backward()
            opt.step()
            ends.append(time.perf_counter())
            if len(ends) in (a.warm + 1, a.warm + a.steps):
                cpu.append((time.thread_time(), time.process_time()))
    timed = ends[a.warm:]
    n = len(timed) - 1
    each = sorted(b - a_ for a_, b in zip(timed, timed[1:]))
    print(json.dumps({"calls": a.calls, "data": a.data, "accum": a.accum, "steps": n, "mean_step_s": (timed[-1] - timed[0]) / n,
                      "p999_step_s": each[min(n - 1, int(0.999 * n))], "max_step_s": each[-1],
                      "thread_cpu_step_s": (cpu[-1][0] - cpu[0][0]) / n,
                      "process_cpu_step_s": (cpu[-1][1] - cpu[0][1]) / n}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
