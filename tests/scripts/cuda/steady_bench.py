"""A steady-state CUDA training step for the probe-overhead measurement: times steps WARMUP..WARMUP+N
between two synchronize() calls (outside the timed loop's hot path) and writes steps/s to $BENCH_OUT."""
import json
import os
import time

import torch
from torch import nn

from cuda_common import DEV, mlp

WARMUP, N = 30, int(os.environ.get("BENCH_STEPS", "300"))
model = mlp(width=4096, depth=4).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(1024, 1024, device=DEV)
y = torch.randint(0, 1000, (1024,), device=DEV)
t0 = None
for step in range(WARMUP + N):
    if step == WARMUP:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
torch.cuda.synchronize()
dt = time.perf_counter() - t0
out = os.environ.get("BENCH_OUT")
if out:
    with open(out, "w") as f:
        json.dump({"steps": N, "seconds": dt, "step_ms": dt / N * 1e3}, f)
