"""Trains 3 steps from a DataLoader, then its collate function fails on the 4th batch with a chained
exception (``raise ... from``): the error passes through the probe's DataLoader wrapper, and Python
prints two tracebacks. Under diag the user sees what a bare run prints (do no harm: no frame of diag's,
the cause not lost)."""
import torch
from torch import nn
from torch.utils.data import DataLoader

from spine_common import tiny_model

LABELS = {i: i % 2 for i in range(48)}


def collate(items):
    try:
        ys = [LABELS[i] for i in items]
    except KeyError as e:
        raise RuntimeError(f"no label for sample {e.args[0]}") from e
    g = torch.Generator().manual_seed(items[0])
    return torch.randn(len(items), 32, generator=g), torch.tensor(ys)


model = tiny_model()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(list(range(64)), batch_size=16, collate_fn=collate):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    print(f"loss {loss.item():.4f}")
