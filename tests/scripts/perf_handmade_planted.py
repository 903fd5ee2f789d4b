"""Test corpus (diag's performance checklist): planted problems that a CPU run can show, with no
DataLoader. Its clean twin is perf_handmade_clean.py. Each plant is marked PLANTED with the check
that must report it; they are combined because they do not hide one another:

- dataloader.main-thread-data: every batch is built by hand in the loop (a 20 ms "read" per batch)
- amp.fp16-without-scaler:     fp16 autocast and no GradScaler
- parallel.data-parallel:      nn.DataParallel (info on a machine with fewer than two GPUs)
- optim.zero-grad:             optimizer.zero_grad(set_to_none=False)
- debug.anomaly-detection:     autograd anomaly detection left on
- eval.no-grad:                evaluation forwards without no_grad (graph bytes measured)
"""
import argparse
import time

import torch
from torch import nn


def read_sample(i: int):
    g = torch.Generator().manual_seed(i)
    x = torch.randn(32, generator=g)
    return x, int(x[:4].sum() > 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=14)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    model = nn.DataParallel(model)                          # PLANTED: parallel.data-parallel
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    torch.autograd.set_detect_anomaly(True)                 # PLANTED: debug.anomaly-detection
    for step in range(args.steps):
        samples = [read_sample(step * 16 + j) for j in range(16)]
        time.sleep(0.020)                                   # PLANTED: main-thread-data ("reading files")
        x = torch.stack([s[0] for s in samples])
        y = torch.tensor([s[1] for s in samples])
        opt.zero_grad(set_to_none=False)                    # PLANTED: optim.zero-grad
        with torch.autocast("cpu", dtype=torch.float16):    # PLANTED: amp.fp16-without-scaler
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if step % 5 == 4:
            model.eval()
            val = torch.randn(64, 32)
            acc = (model(val).argmax(1) == 0).float().mean()    # PLANTED: eval.no-grad
            model.train()
    print(f"loss {loss.item():.3f} acc {acc.item():.2f}")


if __name__ == "__main__":
    main()
