"""No torch.optim: a hand-written SGD update after backward() is still a training step."""
import torch
from torch import nn

from spine_common import batches, tiny_model

model = tiny_model()
for x, y in batches(8):
    loss = nn.functional.cross_entropy(model(x), y)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
print("trained")
