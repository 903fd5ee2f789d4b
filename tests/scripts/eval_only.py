"""An evaluation-only script (a tiny MLP scored on a held-out set), done right by default. Each flag
plants one mistake (tests/test_eval_runs.py):

--grad        no torch.no_grad()/inference_mode(): every forward builds an autograd graph
--no-grad     torch.no_grad() where torch.inference_mode() would do (info)
--train-mode  model.eval() forgotten: dropout is on during evaluation
--bs N        evaluation batch size (1: a batch of one sample per forward)
--item        loss.item() on every batch instead of summing on the device
--slow        a slow __getitem__ (2 ms per sample) with num_workers=0
--forever     loop over the set until stopped (for --max-time)
"""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--grad", action="store_true")
ap.add_argument("--no-grad", action="store_true")
ap.add_argument("--train-mode", action="store_true")
ap.add_argument("--bs", type=int, default=64)
ap.add_argument("--item", action="store_true")
ap.add_argument("--slow", action="store_true")
ap.add_argument("--forever", action="store_true")
ap.add_argument("--samples", type=int, default=1024)
args = ap.parse_args()

torch.manual_seed(0)
DIM = 128
WIDTH = 4096    # a forward of ~10 ms at batch 64: fetching a batch (~0.3 ms) stays a small share of it under load


class HeldOut(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, DIM, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if args.slow:
            time.sleep(0.002)
        return self.x[i], self.y[i]


model = nn.Sequential(nn.Linear(DIM, WIDTH), nn.ReLU(), nn.Dropout(0.1), nn.Linear(WIDTH, WIDTH), nn.ReLU(),
                      nn.Linear(WIDTH, 2))
loader = DataLoader(HeldOut(args.samples), batch_size=args.bs, shuffle=False, num_workers=0)
loss_fn = nn.CrossEntropyLoss(reduction="sum")
if not args.train_mode:
    model.eval()


def score():
    total = torch.zeros(())
    correct = torch.zeros((), dtype=torch.long)
    losses = []
    for x, y in loader:
        out = model(x)
        if args.item:
            losses.append(loss_fn(out, y).item())       # PLANTED-ITEM
        else:
            total += loss_fn(out, y)
        correct += (out.argmax(1) == y).sum()
    loss = sum(losses) if args.item else total.item()
    return loss / len(loader.dataset), correct.item() / len(loader.dataset)


def run_once():
    if args.grad:
        return score()
    if args.no_grad:
        with torch.no_grad():
            return score()
    with torch.inference_mode():
        return score()


while True:
    loss, acc = run_once()
    print(f"eval loss {loss:.4f} accuracy {acc:.3f}", flush=True)
    if not args.forever:
        break
