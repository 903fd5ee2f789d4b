"""Test corpus: DistributedDataParallel in a single process (gloo, world size 1, rendezvous through a
file) with the two DDP mistakes of the tuning guide. Its clean twin is perf_ddp_clean.py.

- ddp.no-sync-accumulation:   4 micro-batches per optimizer step, every backward all-reduces
                              (info with one rank; a warning with more)
- ddp.find-unused-parameters: find_unused_parameters=True although every parameter gets a gradient
"""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist
from torch import nn

ACCUM = 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    store = os.path.join(tempfile.mkdtemp(), "rendezvous")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    model = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)   # PLANTED
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    try:
        for step in range(args.steps):
            for micro in range(ACCUM):                       # PLANTED: no no_sync() on the first 3
                x = torch.randn(16, 32)
                loss = nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()) / ACCUM
                loss.backward()
            opt.step()
            opt.zero_grad()
    finally:
        dist.destroy_process_group()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
