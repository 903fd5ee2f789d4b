"""Test corpus: the clean twin of perf_handmade_planted.py. Same model and data size, trained the way
the tuning guide says: batches sliced from tensors prepared once, fp16 with a GradScaler, no
DataParallel, gradients set to None, no anomaly detection, evaluation under no_grad, and the model
compiled (with the "eager" backend, which runs dynamo but no code generation, to keep the test fast
and free of a C++ compiler). Nothing at warning level or above may be reported."""
import argparse

import torch
from torch import nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=14)
    args = ap.parse_args()
    torch.manual_seed(0)
    xs = torch.randn(args.steps * 16, 32)
    ys = (xs[:, :4].sum(1) > 0).long()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
    cmodel = torch.compile(model, backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(args.steps):
        x, y = xs[step * 16:(step + 1) * 16], ys[step * 16:(step + 1) * 16]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = nn.functional.cross_entropy(cmodel(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if step % 5 == 4:
            model.eval()
            with torch.no_grad():
                acc = (model(torch.randn(64, 32)).argmax(1) == 0).float().mean()
            model.train()
    print(f"loss {loss.item():.3f} acc {acc.item():.2f}")


if __name__ == "__main__":
    main()
