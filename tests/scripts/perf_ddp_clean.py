"""Test corpus: the clean twin of perf_ddp_planted.py: the same single-process DDP run with
find_unused_parameters=False and no_sync() on the first N-1 micro-batches of each accumulation."""
import argparse
import contextlib
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
    model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    try:
        for step in range(args.steps):
            for micro in range(ACCUM):
                last = micro == ACCUM - 1
                with contextlib.nullcontext() if last else model.no_sync():
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
