"""A tiny training loop for diag attach's tests and benchmark; one behaviour per mode.

    python train_target.py MODE PROGRESS_FILE

Modes: steady (compute-bound, no worker: the benchmark's target), starved (slow __getitem__, num_workers=0), saturated (the
same with 2 workers, both busy), balanced (cheap data, 2 workers, compute-bound),
item (a per-step .item() on a line that also reduces a large tensor), stuck-lock (blocks forever on
a lock after a few steps), stuck-queue (blocks forever on queue.get()). Every step appends
"<step> <time>" to PROGRESS_FILE so a test can measure the step rate from outside.
"""
import queue
import sys
import threading
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)
MODE, PROGRESS = sys.argv[1], sys.argv[2]


class Slow(Dataset):
    def __init__(self, delay):
        self.delay = delay

    def __len__(self):
        return 10_000_000

    def __getitem__(self, i):
        if self.delay:
            busy_until = time.perf_counter() + self.delay   # CPU work, like decoding an image
            while time.perf_counter() < busy_until:
                pass
        return torch.randn(64), torch.randn(1)


model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
if MODE == "steady":
    loader = DataLoader(Slow(0.0), batch_size=32, num_workers=0)
elif MODE == "saturated":
    loader = DataLoader(Slow(0.004), batch_size=8, num_workers=2)
elif MODE == "starved":
    loader = DataLoader(Slow(0.004), batch_size=8, num_workers=0)
elif MODE == "balanced":
    loader = DataLoader(Slow(0.0), batch_size=32, num_workers=2, persistent_workers=True)
else:
    loader = DataLoader(Slow(0.0), batch_size=32, num_workers=0)

lock = threading.Lock()
q = queue.Queue()
big = torch.randn(768, 768)
total = 0.0
with open(PROGRESS, "a", buffering=1) as out:
    for step, (x, y) in enumerate(loader, 1):
        if MODE == "balanced":
            for _ in range(8):
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
        else:
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step()
        opt.zero_grad()
        if MODE == "item":
            total += (big @ big).sum().item()        # the host reads a value back every step
        out.write(f"{step} {time.time()}\n")
        if step == 20 and MODE == "stuck-lock":
            lock.acquire()
            lock.acquire()                           # never released: stuck here forever
        if step == 20 and MODE == "stuck-queue":
            q.get()                                  # nobody puts anything: stuck here forever
