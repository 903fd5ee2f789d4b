"""Why the probe's per-step cost grows with the model although its code does not (issue 20,
docs/performance.md): the same small piece of Python work (encoding one step-sized event with
json) timed right after a training step of nn.Sequential(Linear(32, 32), ReLU, ...) of growing depth,
and once more straight after (warm). No probe is installed: this is the machine, not diag.

    .venv/bin/python bench/cold_cache.py [--calls 10,100,300,1000,2000]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

EVENT = {"index": 5, "total_s": 0.01, "data_s": 0.001, "forward_s": 0.003, "backward_s": 0.004,
         "optimizer_s": 0.001, "other_s": 0.0, "n_forward": 1, "n_backward": 1, "samples": 16, "tokens": None,
         "extra": {"pre_forward_s": 1e-5}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", default="10,100,300,1000,2000")
    a = ap.parse_args()
    torch.set_num_threads(1)
    enc = json.JSONEncoder()
    out = {}
    for calls in (int(c) for c in a.calls.split(",")):
        layers: list = []
        for _ in range(max(1, calls // 2)):
            layers += [nn.Linear(32, 32), nn.ReLU()]
        model = nn.Sequential(*layers)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x, y = torch.randn(16, 32), torch.randint(0, 32, (16,))
        cold, warm = [], []
        for _ in range(max(60, 6000 // calls)):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            t0 = time.perf_counter_ns()
            enc.encode(EVENT)
            t1 = time.perf_counter_ns()
            enc.encode(EVENT)
            t2 = time.perf_counter_ns()
            cold.append(t1 - t0)
            warm.append(t2 - t1)
        out[calls] = {"after_step_us": round(statistics.median(cold) / 1e3, 1),
                      "warm_us": round(statistics.median(warm) / 1e3, 1)}
        print(f"{calls:5d} module calls: json-encoding one step event takes {out[calls]['after_step_us']:6.1f} µs "
              f"right after the step, {out[calls]['warm_us']:5.1f} µs again at once", flush=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
