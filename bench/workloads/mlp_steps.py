"""Benchmark workload: a small MLP trained on the CPU with a DataLoader (5-20 ms steps).
Prints one JSON line with the median steady-state step time measured by the script itself."""
import json
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 300
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(64 * steps, 512), torch.randint(0, 10, (64 * steps,)))
times = []
t_prev = time.perf_counter()
for x, y in DataLoader(data, batch_size=64):
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    now = time.perf_counter()
    times.append(now - t_prev)
    t_prev = now
steady = times[20:]
print(json.dumps({"median_step_s": statistics.median(steady), "steps": len(times)}))
