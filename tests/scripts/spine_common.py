"""Tiny model and data shared by the spine test scripts (imported from the script's directory)."""
import torch
from torch import nn


def tiny_model(dim=32, hidden=64):
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def batches(n, bs=16, dim=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        x = torch.randn(bs, dim, generator=g)
        yield x, (x[:, 0] > 0).long()
