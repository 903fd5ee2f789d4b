"""A manual-update loop in the idiom of minimal from-scratch trainers (makemore / "neural networks
from scratch" style): batches sampled by indexing a tensor, no torch.optim; the update is
`p -= lr * p.grad` under torch.no_grad(), and gradients are reset by hand.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (10): one forward + backward + update per iteration
  samples/step     = 64 (the indexed batch)
  phases           = the update (`p -= lr * p.grad`, here ~a third of the step: the model is wide and
                     shallow) is the step's optimizer phase, not "other"; batch building (indexing) is
                     tiny; data + forward + backward + optimizer + other = step total
  findings         clean: no warning, no error
"""
import argparse

import torch
from torch import nn

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
args = p.parse_args()

torch.manual_seed(0)
X = torch.randn(4096, 256)
Y = torch.randint(0, 10, (4096,))
model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10))
lr = 0.05

for step in range(args.steps):
    ix = torch.randint(0, X.shape[0], (64,))
    xb, yb = X[ix], Y[ix]
    loss = nn.functional.cross_entropy(model(xb), yb)
    for p_ in model.parameters():
        p_.grad = None
    loss.backward()
    with torch.no_grad():
        for p_ in model.parameters():
            p_ -= lr * p_.grad

report(steps=args.steps, samples_per_step=64)
