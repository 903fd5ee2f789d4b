"""An LBFGS closure loop in the idiom of pytorch/examples' time_sequence_prediction: the whole
training set is one batch, and each `optimizer.step(closure)` re-evaluates the loss up to max_iter
times (forward + backward inside the step).

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (5): one optimizer.step(closure) per iteration
  samples/step     = 64 (the batch: every closure call evaluates the same 64 samples; the closure
                     calls are not extra samples)
  forwards/step    = the closure calls of that step (between 1 and max_iter=8; printed per step)
  phases           = the closure's forwards and backwards are forward/backward time; optimizer time
                     is only LBFGS's own work (the step total minus the closure); all phases add up
  evaluation       one evaluation forward per step under torch.no_grad (the test loss), not training
  findings         clean: no warning, no error
"""
import argparse

import torch
from torch import nn

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
args = p.parse_args()

torch.manual_seed(0)
x = torch.randn(64, 16)
y = torch.sin(x.sum(1, keepdim=True))
x_test, y_test = torch.randn(32, 16), None
y_test = torch.sin(x_test.sum(1, keepdim=True))

model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1))
criterion = nn.MSELoss()
optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=8)

closure_calls = []
for i in range(args.steps):
    calls = 0

    def closure():
        global calls
        calls += 1
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        return loss

    optimizer.step(closure)
    closure_calls.append(calls)
    with torch.no_grad():
        test_loss = criterion(model(x_test), y_test)
    print(f"step {i}: test loss {test_loss.item():.4f}")

report(steps=args.steps, samples_per_step=64, closure_calls=closure_calls, eval_forwards=args.steps)
