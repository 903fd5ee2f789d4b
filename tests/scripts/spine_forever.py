"""Trains forever with DataLoader workers (for --steps, --max-time and no-orphan tests)."""
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from spine_common import tiny_model


class Endless(Dataset):
    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        x = torch.randn(32)
        return x, int(x[0] > 0)


print(f"pid {os.getpid()}", flush=True)
model = tiny_model()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Endless(), batch_size=16, num_workers=int(sys.argv[1]) if len(sys.argv) > 1 else 2)
try:
    for x, y in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
finally:
    print("finally block ran", flush=True)
