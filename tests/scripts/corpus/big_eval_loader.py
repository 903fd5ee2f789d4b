"""A hand-written trainer with a large evaluation DataLoader beside a worker-fed training
DataLoader: the evaluation set has more batches than the training run, and evaluation (every
--eval-every steps) runs on a checkpoint reloaded with torch.load, as scripts that evaluate their
saved weights do.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (10)
  samples/step     = 32 (train_loader's batch_size)
  loaders          train_loader (batch 32, num_workers=1, persistent) feeds the training steps: the
                   training loader. eval_loader (batch 64, 0 workers, 24 batches per pass, each
                   batch ~10 ms to build) feeds only evaluation forwards: an evaluation loader
  evaluation       2 passes (after steps 5 and 10) x 24 batches = 48 eval forwards under
                   torch.no_grad; their time and their data wait are an evaluation phase, never part
                   of a training step's data wait or total
  phases           = data + forward + backward + optimizer + other = step total
  findings         clean: no warning, no error (the training loader's wait is small).
                   --plant: train_loader with num_workers=0 and a ~1 ms/sample __getitem__ (the
                   training steps wait for data), and evaluation WITHOUT torch.no_grad. Exactly:
                   dataloader.workers (warning or error) located at the train_loader line and
                   reporting num_workers=0 for the training loader; ONE eval.no-grad warning at the
                   evaluation forward's line (the reloaded model is a new object each pass: still one
                   call site, one finding)
"""
import argparse
import os
import shutil
import tempfile
import time

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--eval-every", type=int, default=5)
p.add_argument("--plant", action="store_true")
args = p.parse_args()


class Features(Dataset):
    def __init__(self, n, seed, cost_s=0.0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 64, generator=g)
        self.y = torch.randint(0, 8, (n,), generator=g)
        self.cost_s = cost_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.cost_s:
            time.sleep(self.cost_s)          # decoding / augmentation stand-in
        return self.x[i], self.y[i]


def evaluate(model, loader):
    model.eval()
    correct = forwards = 0
    for x, y in loader:
        if args.plant:
            out = model(x)                   # planted: no torch.no_grad()
        else:
            with torch.no_grad():
                out = model(x)
        correct += int((out.argmax(1) == y).sum())
        forwards += 1
    model.train()
    return correct, forwards


if __name__ == "__main__":
    torch.manual_seed(0)
    train_set = Features(32 * args.steps, 1, cost_s=0.001 if args.plant else 0.0)
    eval_set = Features(64 * 24, 2, cost_s=0.00015)
    workers = 0 if args.plant else 1
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True, num_workers=workers,
                              persistent_workers=workers > 0)
    eval_loader = DataLoader(eval_set, batch_size=64)

    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ckpt = os.path.join(tempfile.mkdtemp(prefix="corpus-eval-"), "model.pt")
    steps = eval_forwards = 0
    for x, y in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        steps += 1
        if steps % args.eval_every == 0:
            torch.save(model, ckpt)
            snapshot = torch.load(ckpt, weights_only=False)
            _, n = evaluate(snapshot, eval_loader)
            eval_forwards += n
    shutil.rmtree(os.path.dirname(ckpt), ignore_errors=True)
    report(steps=steps, samples_per_step=32, eval_forwards=eval_forwards,
           eval_batches_per_pass=len(eval_loader), train_loader_workers=workers)
