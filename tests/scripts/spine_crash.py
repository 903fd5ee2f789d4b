"""Trains 3 steps, then fails in the user's own code."""
import torch
from torch import nn

from spine_common import batches, tiny_model


def load_checkpoint(path):
    raise ValueError(f"planted failure: checkpoint {path} is corrupt")


model = tiny_model()
opt = torch.optim.Adam(model.parameters())
for x, y in batches(3):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
print("about to fail")
load_checkpoint("ckpt.pt")
