"""Training followed by evaluation done every correct way; with --bad, one evaluation loop without
no_grad at the line marked BAD-EVAL."""
import argparse

import torch
from torch import nn

from spine_common import batches, tiny_model

ap = argparse.ArgumentParser()
ap.add_argument("--bad", action="store_true")
args = ap.parse_args()

model = tiny_model()
frozen = tiny_model()
for p in frozen.parameters():
    p.requires_grad_(False)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
loss_fn = nn.CrossEntropyLoss()
for x, y in batches(6):
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()

model.eval()
frozen.eval()
with torch.no_grad():
    for x, _ in batches(2):
        model(x)
with torch.inference_mode():
    for x, _ in batches(2):
        model(x)


@torch.no_grad()
def evaluate(m):
    for x, _ in batches(2):
        m(x)


evaluate(model)
for x, _ in batches(2):
    frozen(x)                      # frozen module: its output needs no grad
if args.bad:
    for x, _ in batches(3):
        model(x)                   # BAD-EVAL
print("done")
