"""Shared by the CUDA twins of the planted corpus (run by scripts/gpu-check.sh on a real GPU)."""
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

DEV = os.environ.get("DIAG_TWIN_DEVICE", "cuda")   # "cpu" only to test the runner without a GPU


def mlp(width: int = 4096, depth: int = 4, out: int = 1000) -> nn.Module:
    layers, d = [], 1024
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, out))
    return nn.Sequential(*layers)


class SlowData(Dataset):
    """Random samples; ``delay`` seconds of host work per sample (decoding, augmenting)."""

    def __init__(self, n: int = 100_000, delay: float = 0.0, dim: int = 1024, classes: int = 1000):
        self.n, self.delay, self.dim, self.classes = n, delay, dim, classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.delay:
            end = time.perf_counter() + self.delay
            while time.perf_counter() < end:     # busy host work, like a decoder
                pass
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), int(torch.randint(0, self.classes, (1,), generator=g))


def loader(batch: int = 256, delay: float = 0.0, workers: int = 0, pin: bool = False, **kw) -> DataLoader:
    return DataLoader(SlowData(delay=delay, **kw), batch_size=batch, num_workers=workers, pin_memory=pin,
                      shuffle=False, drop_last=True, persistent_workers=workers > 0)
