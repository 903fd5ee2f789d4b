"""A plain loop that compiles its model (torch.compile with the "eager" backend: dynamo traces, no C
compiler needed) and creates a GradScaler for CUDA on a machine without CUDA, as scripts written
for a GPU do when run on a laptop.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (6)
  samples/step     = 16
  the script's own output
                   torch's "GradScaler is enabled, but CUDA is not available. Disabling." warning
                   names THIS file at the `GradScaler(...)` line (it is the user's call), never a
                   file inside diag; and no "Using `torch.compile(module)` when there are global
                   hooks" warning appears (diag's hooks cause it, not the script: without diag the
                   script prints none)
  findings         clean: no warning, no error
"""
import argparse

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
args = p.parse_args()

torch.manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(16 * args.steps, 32), torch.randint(0, 4, (16 * args.steps,))),
                    batch_size=16)
model = torch.compile(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)), backend="eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")   # disabled (with a warning) where there is no CUDA

steps = 0
for x, y in loader:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    steps += 1

report(steps=steps, samples_per_step=16)
