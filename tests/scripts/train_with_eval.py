"""Training with periodic evaluation (every --eval-every steps, on its own DataLoader), done right:
the evaluation runs under inference_mode in eval mode. argv: --steps N --eval-every K --eval-batches B;
--slow-eval: each evaluation batch takes 40 ms to load; --eval-first: evaluate at the top of the loop
body, after the training batch was fetched and before it trains."""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset


class SlowBatches(Dataset):
    """Evaluation samples; with --slow-eval the first sample of each batch takes 40 ms."""

    def __init__(self, x):
        self.x, self.y = x, (x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if args.slow_eval and i % 64 == 0:
            time.sleep(0.04)
        return self.x[i], self.y[i]



ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=24)
ap.add_argument("--eval-every", type=int, default=8)
ap.add_argument("--eval-batches", type=int, default=6)
ap.add_argument("--slow-eval", action="store_true")
ap.add_argument("--eval-first", action="store_true")
args = ap.parse_args()

torch.manual_seed(0)
DIM = 64
x = torch.randn(args.steps * 32, DIM)
train = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=32, shuffle=True)
xv = torch.randn(args.eval_batches * 64, DIM)
val = DataLoader(SlowBatches(xv), batch_size=64)


class Net(nn.Sequential):
    """A training forward of ~6 ms (a sleep stands in for a heavier model): the training step's data
    wait (~0.2 ms) then stays far from the data checks' thresholds on a loaded machine, so the same
    training verdicts with and without evaluation are not left to chance."""

    def forward(self, x):
        if self.training:
            time.sleep(0.006)
        return super().forward(x)


model = Net(nn.Linear(DIM, 256), nn.ReLU(), nn.Linear(256, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loss_fn = nn.CrossEntropyLoss()


def evaluate():
    model.eval()
    correct = torch.zeros((), dtype=torch.long)
    with torch.inference_mode():
        for xb, yb in val:
            correct += (model(xb).argmax(1) == yb).sum()
    model.train()
    return correct.item() / len(val.dataset)


step = 0
for xb, yb in train:
    if args.eval_first and step and step % args.eval_every == 0:
        print(f"step {step} val acc {evaluate():.3f}", flush=True)
    opt.zero_grad()
    loss_fn(model(xb), yb).backward()
    opt.step()
    step += 1
    if not args.eval_first and step % args.eval_every == 0:
        print(f"step {step} val acc {evaluate():.3f}", flush=True)
