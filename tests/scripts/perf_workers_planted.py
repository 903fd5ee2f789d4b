"""Test corpus: DataLoader workers re-spawned at every epoch, and a profiler left on for the whole run.
Its clean twin is perf_workers_clean.py.

- dataloader.persistent-workers: num_workers=1 without persistent_workers, short epochs, and a
                                 worker_init_fn (60 ms) paid again at every epoch (6 batches)
- debug.anomaly-detection:       torch.profiler.profile() around the whole training
- optim.zero-grad:               model.zero_grad(set_to_none=False) (nn.Module's, not the optimizer's)
"""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


def open_shards(worker_id: int):
    """What a real worker_init_fn does once per worker: open files, connect to a store, load an
    index. Here 60 ms of it."""
    time.sleep(0.06)


class Points(Dataset):
    def __init__(self, n: int):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = (self.x[:, :4].sum(1) > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)                                # leave a CPU to the worker
    model = nn.Sequential(nn.Linear(32, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Points(384), batch_size=64, shuffle=True, num_workers=1,
                        worker_init_fn=open_shards)         # PLANTED: persistent_workers=False
    with torch.profiler.profile():                          # PLANTED: a profiler left on
        for epoch in range(args.epochs):
            for x, y in loader:
                model.zero_grad(set_to_none=False)          # PLANTED: optim.zero-grad
                loss = nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
    print(f"loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
