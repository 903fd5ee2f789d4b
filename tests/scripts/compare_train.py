"""A tiny CPU training loop with stable, sleep-dominated phases, for diag compare's tests.

    --slow PHASE=SECONDS   add that many seconds to one phase (forward, backward, data, other)
    --hidden N             hidden width (a larger one = more parameter/gradient/optimizer memory)
    --anomaly              turn on autograd anomaly detection (a planted finding)
    --steps N              training steps (default 40)
"""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--slow", action="append", default=[])
ap.add_argument("--hidden", type=int, default=64)
ap.add_argument("--anomaly", action="store_true")
ap.add_argument("--steps", type=int, default=40)
args = ap.parse_args()
extra = {"forward": 0.0, "backward": 0.0, "other": 0.0, "data": 0.0}
for item in args.slow:
    phase, _, sec = item.partition("=")
    extra[phase] += float(sec)

BASE = 0.004    # seconds each timed phase sleeps: keeps the step time stable on a loaded machine


class Items(Dataset):
    def __len__(self):
        return 16 * args.steps

    def __getitem__(self, i):
        return torch.full((32,), float(i % 7)), i % 2


class Data(DataLoader):
    pass


def collate(batch):
    time.sleep(BASE / 2 + extra["data"])
    return torch.stack([b[0] for b in batch]), torch.tensor([b[1] for b in batch])


class Slow(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(32, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 2)

    def forward(self, x):
        time.sleep(BASE + extra["forward"])
        h = self.inner(x)
        if h.requires_grad:   # inside the backward pass, after its start at the model's output
            h.register_hook(lambda g: (time.sleep(BASE + extra["backward"]), g)[1])
        return self.head(h)


torch.manual_seed(0)
torch.set_num_threads(1)   # a tiny model: more threads only fight over a loaded machine
if args.anomaly:
    torch.autograd.set_detect_anomaly(True)
model = Slow(args.hidden)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for x, y in DataLoader(Items(), batch_size=16, collate_fn=collate):
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    time.sleep(extra["other"])
    opt.step()
