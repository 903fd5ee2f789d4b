"""Gradient accumulation (4 micro-batches of 8 token rows per optimizer step) and, with --gan, a second
model trained in the same step on other data: a step's samples are the micro-batches of its first call
site, nothing else."""
import sys

import torch
import torch.nn as nn

V = 50


def main():
    torch.manual_seed(0)
    lm = nn.Sequential(nn.Embedding(V, 16), nn.Flatten(), nn.Linear(16 * 6, V))
    critic = nn.Linear(V, 1)
    params = list(lm.parameters()) + (list(critic.parameters()) if "--gan" in sys.argv else [])
    opt = torch.optim.SGD(params, lr=0.1)
    for _ in range(6):
        opt.zero_grad()
        for _ in range(4):
            ids = torch.randint(0, V, (8, 6))
            logits = lm(ids)                                  # MICRO-BATCH
            loss = logits.logsumexp(-1).mean() / 4
            if "--gan" in sys.argv:
                loss = loss + critic(torch.randn(32, V)).mean()   # OTHER-MODEL
            loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
